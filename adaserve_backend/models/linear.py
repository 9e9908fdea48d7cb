"""A linear layer that runs CPU bfloat16 inference on a weight prepacked for oneDNN.

`F.linear` in bfloat16 on CPU reorders the weight into oneDNN's blocked layout on every call; with
the weight prepacked once, AMX/AVX512-BF16 kernels read it straight away, which matters most for the
few-row GEMMs of decode and small trees (evidence: docs/experiments.md#threads). float32 keeps
`F.linear` so the oracle path stays bit-exact with `transformers`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def prepacking_available(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available()
        and torch.ops.mkldnn._is_mkldnn_bf16_supported()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


# Bumped by every prepack: what caches built over packed weights (fused_layer.fused_stack) check.
pack_generation = 0


class Linear(nn.Linear):
    _packed: torch.Tensor | None = None
    _packed_version = -1

    def prepack(self) -> None:
        """Pack the current weight for inference; a no-op where prepacking does not apply."""
        global pack_generation
        pack_generation += 1
        self._packed = None
        if prepacking_available(self.weight):
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)
            self._packed_version = self.weight._version

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The version check keeps a model that is trained after packing (in-place optimizer steps
        # bump the version) from reading a stale copy; training itself never takes this path.
        if self._packed is not None and not torch.is_grad_enabled() and self._packed_version == self.weight._version:
            return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


def prepack_all(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, Linear):
            m.prepack()
