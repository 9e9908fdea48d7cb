"""The prepared check for a lent GPU machine (issue 72), one concept per module; `tools/gpu_check.py` is its
command line (`python3 -m tools.gpu_check`, `make gpu-check`). Imports go down this list, never up:

- runner: the run itself, step after step within the time budget, the results saved after each
  - steps: which steps, in order, and what each needs to be worth starting
    - install (+ model_parts: the embedded SmolLM2 carried in parts), kernel_compile, pytest_run, accuracy:
      the steps before the measurements
    - attention_bench, layer_bench (+ decoder_stack, peaks, targets): the measurements
    - graph_bench: the engine's decode step at the 8B shape, eager and replayed as CUDA graphs
    - draft_step_bench (+ draft_head, graphed_attention): a draft beam step, eager and as a CUDA graph
    - engine_bench: the engine end to end with the embedded model (also on the CPU: its own command line)
      - points: what is measured (Llama-3.1-8B's shape, the batches); measuring: how (timings, backends)
  - report: the JSON and markdown written after every step
- kernels: FlashInfer's compiled kernels as files (prebuilt, packed to come back, unpacked when carried)
- env: where things go on the machine, the environment of the check and its child processes

Everything runs with the GPU machine's own python3: these modules import only the standard library, torch
(inside the steps that need it), this project's engine modules, transformers and flashinfer.
"""
