"""The check's results as gpu-check.json (everything, for the record) and gpu-check.md (what a person reads:
the steps, compile times, test summary, accuracy, attention and layer tables, issue 72's targets), written
whole after every step through a temporary file, so a run cut off at any point leaves readable files, and
copied to $OUT, which the device tool brings back."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tools.gpu.kernels import DTYPES


def fmt(x, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "NO"
    if isinstance(x, float):
        if x == 0 or abs(x) >= 1e4:
            return f"{x:.{digits + 1}g}"
        return f"{x:.{digits}g}" if abs(x) < 1 else f"{x:.{digits}f}".rstrip("0").rstrip(".")
    return str(x)


def table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(c) for c in r) + " |" for r in rows]
    return lines + [""]


def render_markdown(r: dict) -> str:
    env = r.get("env", {})
    out = [f"# gpu-check {r.get('started', '')}", ""]
    out.append(f"{env.get('device', 'no device')} ({env.get('capability', '?')}, {env.get('sms', '?')} SMs, "
               f"{env.get('memory_gib', '?')} GiB); torch {env.get('torch', '?')}, CUDA {env.get('torch_cuda', '?')}, "
               f"flashinfer {env.get('flashinfer', '-')}, Python {env.get('python', '?')}; "
               f"nvcc: {env.get('nvcc', '-')}; driver: {env.get('nvidia_smi', '-')}. "
               f"Wall time {fmt(r.get('wall_s'))} s.")
    out.append("")
    out.append("## Steps")
    out.append("")
    steps = r.get("steps", {})
    out += table(["step", "status", "seconds", "note"],
                 [[name, "ok" if s.get("ok") else ("skipped" if s.get("skipped") else "FAILED"), s.get("seconds"),
                   (s.get("skipped") or s.get("error") or "").replace("|", "/").replace("\n", " ")[:300]]
                  for name, s in steps.items()])
    c = r.get("compile")
    if c:
        out.append("## Compile (first use of FlashInfer's kernels, per dtype, both at once)")
        out.append("")
        rows = []
        for d in DTYPES:
            x = c.get(d, {})
            first = x.get("compile", x)  # after a fallback: the failed compile's figures
            calls = first.get("first_calls_s", {})
            rows.append([d, x.get("ok"), x.get("source"), first.get("seconds"), first.get("import_s"),
                         calls.get("masked prefill"), calls.get("causal prefill"), calls.get("decode"),
                         first.get("wall_s")])
        out += table(["dtype", "ok", "kernels", "worker s", "import s", "1st masked prefill s", "1st causal s",
                      "1st decode s", "done at s"], rows)
        if c.get("prebuilt_present"):
            out.append("Prebuilt kernels were in flashinfer's prebuilt folder (loaded, not compiled): "
                       + ", ".join(c["prebuilt_present"]) + ".")
            out.append("")
        p = c.get("packed", {})
        if p:
            out.append(f"Compiled libraries: {p.get('libraries')} ({fmt(p.get('mb'))} MB, packed "
                       f"{fmt(p.get('tar_mb'))} MB, {p.get('out_parts', 0)} parts in $OUT).")
            out.append("")
    t = r.get("tests")
    if t:
        out.append("## Tests")
        out.append("")
        out.append(f"{t.get('passed', '?')} passed, {t.get('failed', '?')} failed, {t.get('errors', '?')} errors, "
                   f"{t.get('skipped', '?')} skipped in {fmt(t.get('seconds'))} s (log: {t.get('log', '-')}).")
        out.append("")
        for f in t.get("failures", []):
            out.append(f"- {f['kind']}: `{f['test']}`: {f['message'][:300]}")
        for reason, n in t.get("skip_reasons", {}).items():
            out.append(f"- skipped {n}: {reason}")
        for test, values in t.get("reported", {}).items():
            out += [f"- `{test}` reports {name}: {value}" for name, value in values.items()]
        out.append("")
    a = r.get("accuracy")
    if a:
        out.append("## Accuracy against the reference (max abs difference from the float32 reference over the "
                   "same inputs, its output rounded to the dtype, and unrounded)")
        out.append("")
        out += table(["dtype", "batch", "backend", "tokens", "max abs err", "vs unrounded", "max abs ref", "error"],
                     [[x.get("dtype"), x.get("batch"), x.get("backend"), x.get("tokens"), x.get("max_abs_err"),
                       x.get("max_abs_err_vs_unrounded"), x.get("max_abs_ref"), x.get("error")] for x in a])
    att = r.get("attention")
    if att:
        out.append("## Attention per layer (bf16; 32 query heads, 8 KV heads, head_dim 128, pages of 16)")
        out.append("")
        out += table(["batch", "tokens", "KV MB", "FlashInfer ms", "kernel", "SDPA ms", "SDPA / FI", "FI plan ms",
                      "SDPA plan ms", "FI KV GB/s", "note"],
                     [[x.get("name"), x.get("tokens"), x.get("kv_mb"), x.get("flashinfer_ms"),
                       x.get("flashinfer_kernel"), x.get("sdpa_ms"), x.get("speedup"), x.get("flashinfer_plan_ms"),
                       x.get("sdpa_plan_ms"),
                       x.get("flashinfer_gb_s"),
                       x.get("skipped") or x.get("error") or x.get("flashinfer_error") or x.get("sdpa_error")]
                      for x in att])
    lay = r.get("layers")
    if lay:
        m = lay.get("measured", {})
        out.append(f"## Decoder layers ({lay.get('layers')} Llama-3.1-8B layers, random bf16 weights, "
                   f"{fmt(lay.get('layer_weight_mb'))} MB each; times scaled to {lay.get('scaled_to')} layers "
                   "+ output head + plan; eager)")
        out.append("")
        out.append(f"Measured: copy {fmt(m.get('copy_tb_s'))} TB/s, bf16 matmul {fmt(m.get('bf16_matmul_tflops'))} "
                   f"TFLOP/s; sheet: {fmt((lay.get('spec_hbm_bytes_s') or 0) / 1e12 or None)} TB/s, "
                   f"{fmt((lay.get('spec_bf16_flops') or 0) / 1e12 or None)} TFLOP/s.")
        out.append("")
        out += table(["point", "tokens", "backend", "ms/layer", "est. forward ms", "tokens/s", "plan ms",
                      "head ms", "HBM TB/s", "of sheet", "TFLOP/s", "of sheet", "note"],
                     [[x.get("name"), x.get("tokens"), x.get("backend"), x.get("layer_ms"), x.get("est_forward_ms"),
                       x.get("tokens_per_s"), x.get("plan_ms"), x.get("lm_head_ms"), x.get("hbm_tb_s"),
                       x.get("hbm_fraction"), x.get("tflops"), x.get("flops_fraction"),
                       x.get("skipped") or x.get("error")] for x in lay.get("points", [])])
        tg = lay.get("targets")
        if tg:
            out.append("### Issue 72's targets (eager, no CUDA graphs yet)")
            out.append("")
            keys = ["b1_decode_ms", "b1_decode_ok", "b1_decode_hbm_fraction", "b1_tree64_over_decode", "b1_tree64_ok",
                    "b16_tree64_over_decode", "b16_tree64_ok", "prefill2048_flops_fraction", "prefill2048_ok"]
            names = list(tg)
            out += table(["target"] + names, [[k] + [tg[n].get(k) for n in names] for k in keys])
    out += draft_section(r.get("draft"))
    out += engine_section(r.get("engine"))
    out += graphs_section(r.get("graphs"))
    return "\n".join(out).rstrip() + "\n"


def draft_section(d: dict | None) -> list[str]:
    if not d:
        return []
    out = [f"## Draft beam step (EAGLE-3-style one-layer head at Llama-3.1-8B's width, random bf16, "
           f"{fmt(d.get('weight_mb'))} MB of weights a step; eager with {d.get('backend')}, and replayed as a "
           f"CUDA graph; target: graph ms <= {fmt(d.get('target_ms'))})", ""]
    if d.get("graphs_not_measured"):
        out += [f"CUDA graphs not measured: {d['graphs_not_measured']}.", ""]
    out += table(["point", "batch", "width", "context", "tokens", "eager ms", "graph ms", "target met", "eager / graph",
                  "read MB", "KV MB", "HBM of sheet (graph, else eager)", "eager plan ms", "graph plan ms", "kernel",
                  "ids agree", "max abs diff", "note"],
                 [[x.get("name"), x.get("batch"), x.get("width"), x.get("context"), x.get("tokens"), x.get("eager_ms"),
                   x.get("graph_ms"), x.get("target_ok"), x.get("speedup"), x.get("read_mb"), x.get("kv_mb"),
                   x.get("hbm_fraction", x.get("eager_hbm_fraction")), x.get("eager_plan_ms"),
                   x.get("graph_plan_ms"), x.get("graph_kernel"), x.get("graph_ids_agree"),
                   x.get("graph_max_abs_diff"), x.get("skipped") or x.get("error") or x.get("graph_error")]
                  for x in d.get("points", [])])
    tg = d.get("targets")
    if tg:
        out += table(["context", "points", "met", "slowest ms", "slowest point", "all met"],
                     [[c, t.get("points"), t.get("met"), t.get("worst_ms"), t.get("worst_point"), t.get("ok")]
                      for c, t in tg.items()])
    return out


def engine_section(e: dict | None) -> list[str]:
    if not e:
        return []
    st = e.get("settings", {})
    out = [f"## The engine end to end ({e.get('model', 'the embedded SmolLM2')} + the shipped draft, "
           f"{st.get('dtype', '-')} on {st.get('device', '-')}; {st.get('prompt_tokens', '-')}-token prompt, "
           f"{st.get('output_tokens', '-')} tokens greedy; single: median of {st.get('runs', '-')} runs)", ""]
    if e.get("skipped"):
        return out + [f"Skipped: {e['skipped']}", ""]
    if e.get("flashinfer_kernels") or e.get("flashinfer"):
        out += [f"FlashInfer at head_dim 64: {e.get('flashinfer_kernels') or e.get('flashinfer')}.", ""]
    out += table(["backend", "policy", "requests", "TTFT ms", "TPOT ms", "tokens/s", "tokens/step", "same tokens",
                  "CUDA graphs", "load s", "warm-up s", "note"],
                 [[x.get("backend"), x.get("policy"), x.get("requests"), x.get("ttft_ms"), x.get("tpot_ms"),
                   x.get("tokens_per_s"), x.get("accepted_per_step"), x.get("same_tokens_as_first_engine"),
                   x.get("cuda_graphs"), x.get("load_s"), x.get("warm_up_s"), x.get("skipped") or x.get("error")]
                  for x in e.get("rows", [])])
    return out


def graphs_section(g: dict | None) -> list[str]:
    if not g:
        return []
    out = [f"## The engine's decode step, eager and CUDA graphs (ModelRunner at Llama-3.1-8B's shape, random bf16; "
           f"timed at {g.get('layers')} layers, estimated at {g.get('scaled_to')}; context {g.get('context')})", ""]
    out += table(["mode", "batch", "ms at layers", "ms/layer", "fixed ms", "est. step ms", "weights TB/s"],
                 [[x.get("mode"), x.get("batch"), x.get("ms_at"), x.get("layer_ms"), x.get("fixed_ms"),
                   x.get("est_step_ms"), x.get("weights_tb_s")] for x in g.get("points", [])])
    for e in g.get("errors", []):
        out.append(f"- error: {e}")
    if g.get("targets"):
        out += ["", "Targets: " + ", ".join(f"{k} {fmt(v)}" for k, v in g["targets"].items()), ""]
    return out


def write_results(results: dict, run_dir: Path, out: Path | None = None) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("gpu-check.json", json.dumps(results, indent=1, default=str)),
                       ("gpu-check.md", render_markdown(results))):
        tmp = run_dir / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(run_dir / name)
        if out is not None:
            shutil.copy2(run_dir / name, out / name)
