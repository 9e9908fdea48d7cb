"""A linear layer that runs CPU bfloat16 inference on weights prepacked once.

`F.linear` in bfloat16 on CPU reorders the weight into oneDNN's blocked layout on every call; with
the weight prepacked once, AMX/AVX512-BF16 kernels read it straight away (evidence:
docs/architecture.md#the-model-runtime). Where the CPU has AVX512-BF16 a second packing serves the project's own
kernel (csrc/pair_gemm.h): a few-row product (decode, small trees, their LM head) is a read of the
weight, and that kernel reads it closer to the memory bandwidth. Where the CPU has AVX2 but no
AVX512-BF16, oneDNN packs no bfloat16 weight and torch's own bfloat16 GEMM is several times slower
than float32, so the pair kernel's AVX2 build serves every row count alone. Which packing a product
takes is decided in one place, the C++ `packed_linear` the fused decoder layers call too. float32 keeps
`F.linear` so the oracle path stays bit-exact with `transformers`.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..cpu_extension import load_extension

KERNELS = Path(__file__).parent / "csrc" / "decoder_layer.cpp"


def kernels():
    """The compiled decoder-layer extension (csrc/decoder_layer.cpp), or None."""
    return load_extension("adaserve_decoder_layer", KERNELS)


def prepacking_available(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available()
        and torch.ops.mkldnn._is_mkldnn_bf16_supported()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def pairs_serve_alone(weight: torch.Tensor) -> bool:
    """Whether the pair kernel takes every product of this bfloat16 weight (an AVX2 CPU, no oneDNN
    packing) rather than only the few-row ones."""
    ops = kernels()
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and ops is not None and ops.pair_gemm
            and not prepacking_available(weight))


# Bumped by every prepack: what caches built over packed weights (fused_layer.fused_stack) check.
pack_generation = 0


def pack_pairs(weight: torch.Tensor) -> torch.Tensor | None:
    """The weight in the pair kernel's layout, or None where that kernel does not apply."""
    ops = kernels()
    out, inp = weight.shape
    if ops is None or not ops.pair_gemm or out % 16 or inp % 2:
        return None
    return ops.pack_pairs(weight.detach())


class Linear(nn.Linear):
    _packed: torch.Tensor | None = None
    _pairs: torch.Tensor | None = None  # the pair kernel's packing, for products of few rows
    # GGUF blocks (Q4_1, Q8_0) of the same values (models/quantized.py), for the fewest rows
    _blocks: torch.Tensor | None = None
    _packed_version = -1

    def prepack(self) -> None:
        """Pack the current weight for inference; a no-op where prepacking does not apply."""
        global pack_generation
        pack_generation += 1
        self._packed = self._pairs = self._blocks = None
        if prepacking_available(self.weight):
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)
            self._pairs = pack_pairs(self.weight)
            self._packed_version = self.weight._version
        elif pairs_serve_alone(self.weight) and (pairs := pack_pairs(self.weight)) is not None:
            # packed_linear reads the pairs at every row count here; the plain weight stands where
            # oneDNN's packing would, so the fused layers see a packed projection.
            self._packed, self._pairs, self._packed_version = self.weight.detach(), pairs, self.weight._version

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The version check keeps a model that is trained after packing (in-place optimizer steps
        # bump the version) from reading a stale copy; training itself never takes this path.
        if self._packed is not None and not torch.is_grad_enabled() and self._packed_version == self.weight._version:
            if self._pairs is not None or self._blocks is not None:  # packed by the kernels, so they are built
                return kernels().packed_linear(x, self._packed, self._pairs, self._blocks, self.bias)
            return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


def prepack_all(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, Linear):
            m.prepack()
