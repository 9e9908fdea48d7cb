"""The packages import in one direction: every import goes to the same or a lower layer, and no
modules import each other in a circle (lazy and TYPE_CHECKING imports count too)."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("adaserve_backend", "harness", "sim", "client", "benchmarks", "tools", "model_repository")
# Lowest first. A module's layer is that of its longest listed prefix.
LAYERS = [
    ["adaserve_backend.config", "adaserve_backend.request", "adaserve_backend.slo", "adaserve_backend.chat",
     "adaserve_backend.cpu_extension", "adaserve_backend.stop_strings", "adaserve_backend.child_process",
     "adaserve_backend.device", "adaserve_backend.request_fields", "adaserve_backend.grammar.spec"],
    ["adaserve_backend.kv_cache", "adaserve_backend.attention", "adaserve_backend.models",
     "adaserve_backend.cost_model",
     "adaserve_backend.sampling", "adaserve_backend.cuda_graphs", "adaserve_backend.grammar"],
    ["adaserve_backend.model_runner", "adaserve_backend.sequence", "adaserve_backend.output_processor"],
    ["adaserve_backend.scheduler"],
    ["adaserve_backend.speculation", "adaserve_backend.profiler", "adaserve_backend.calibration_pool",
     "adaserve_backend.replica_routing"],
    ["adaserve_backend.engine", "adaserve_backend.inbox"],
    ["adaserve_backend.serving"],
    ["adaserve_backend.triton", "adaserve_backend.openai_frontend", "adaserve_backend.serve"],
    ["adaserve_backend.ray_serve"],
    ["harness", "client"],
    ["sim", "benchmarks", "tools"],
    ["model_repository"],
]


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def imports(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # `import a.b.c` of a module we hold, or a name inside one
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def layer(name: str) -> int:
    if name == "adaserve_backend":  # the package's (empty) __init__; its modules each have their own layer
        return 0
    best = max(((len(p), i) for i, ps in enumerate(LAYERS) for p in ps if name == p or name.startswith(p + ".")),
               default=None)
    assert best is not None, f"{name} is in no layer: add it to LAYERS"
    return best[1]


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports(m, p, set(mods)) for m, p in mods.items()}


def test_no_import_goes_up_a_layer():
    up = [f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
          for a, bs in graph().items() for b in bs if layer(b) > layer(a)]
    assert not up, "\n".join(up)


def test_no_import_circle():
    g = graph()
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(g[m]):
            if n.startswith(m + "."):  # a package importing its own submodules is not a circle
                continue
            if state.get(n) == 1 and not m.startswith(n + "."):
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(n):] + [n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m)


def test_the_ray_replicas_load_nothing_of_triton():
    """ray_serve shares the engine driver (serving/) and the OpenAI frontend with the Triton path, not
    Triton's glue: importing its modules loads no module of adaserve_backend.triton."""
    import subprocess
    import sys

    code = ("import sys, adaserve_backend.ray_serve.app, adaserve_backend.ray_serve.replica; "
            "print(sorted(m for m in sys.modules if m.startswith('adaserve_backend.triton')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"
