#!/usr/bin/env bash
# llama.cpp as a side-by-side peer, built from the source vendored in the `llama-cpp-python` sdist (a
# registry package; nothing else is reachable here). Builds llama-server and llama-bench into DIR/bin,
# and makes DIR/smollm2-bf16.gguf from the embedded model with the sdist's own converter, beside the
# shipped Q4_1 file. Never touches the project's venv; tests never need any of it.
# Usage: benchmarks/llamacpp/build.sh DIR PYTHON   (PYTHON: a venv with torch, numpy, transformers)
set -euo pipefail
DIR="$(realpath -m "${1:-.peers/llamacpp}")"
PY="${2:-.venv/bin/python}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
mkdir -p "$DIR"
if [ ! -d "$DIR/src" ]; then
  "$PY" -m pip download --quiet --no-binary :all: --no-deps --dest "$DIR/sdist" "llama-cpp-python==$VERSION"
  mkdir -p "$DIR/src.tmp"
  tar -xzf "$DIR"/sdist/llama_cpp_python-*.tar.gz -C "$DIR/src.tmp" --strip-components=1
  mv "$DIR/src.tmp" "$DIR/src"
fi
if [ ! -x "$DIR/bin/llama-server" ] || [ ! -x "$DIR/bin/llama-bench" ]; then
  # GGML_NATIVE: the kernels for this CPU's own instruction set, as a llama.cpp user builds them.
  cmake -S "$DIR/src/vendor/llama.cpp" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF \
    -DBUILD_SHARED_LIBS=OFF >"$DIR/cmake.log"
  cmake --build "$DIR/build" -j "$(nproc)" --target llama-server llama-bench
  mkdir -p "$DIR/bin"
  cp "$DIR/build/bin/llama-server" "$DIR/build/bin/llama-bench" "$DIR/bin/"
fi
"$DIR/bin/llama-server" --version 2>&1 | head -n 2
