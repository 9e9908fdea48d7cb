"""How the CPU kernels are chosen (KernelConfig); models/kernel_choice.py measures and applies it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelConfig:
    """batch_invariant: every bfloat16 product takes one kernel at every row count (the pair kernel, or
      AMX tiles where the CPU has them and they measure faster), so a token's logits never depend on
      how many other rows shared its step: identical greedy requests give identical output under any
      load, with or without speculation. false: products above a crossover measured at startup take
      oneDNN where it is faster there (some CPUs with AMX), and greedy output may then change with the
      batch a request happened to share, as it does in vLLM and llama.cpp.
    measure: time the candidates at startup on this machine (a second or two); false keeps the pair kernel at
      every row count without measuring (tests, and runs that must start fastest).
    """

    batch_invariant: bool = True
    measure: bool = True

    def __post_init__(self) -> None:
        for name in ("batch_invariant", "measure"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"kernels.{name} must be true or false, got {getattr(self, name)!r}")
