"""CUDA graphs of the engine's forwards, on a GPU only: what both kinds share (capture.py: static
buffers, token-count buckets, capture and replay), plain decode (decode.py) and the draft's beam steps
(tree.py). The model runner captures them when its attention backend says it can be captured
(`AttentionBackend.cuda_graphs`); the CPU tests replay them by rerunning (capture.eager_capture)."""
