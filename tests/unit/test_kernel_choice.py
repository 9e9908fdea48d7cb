"""The CPU kernels' choice (models/kernel_choice.py): plans chosen from measured times, and a row's
numbers independent of the rows beside it under the default, batch-invariant choice."""

from __future__ import annotations

import pytest
import torch

from adaserve_backend.config import EngineConfig, KernelConfig
from adaserve_backend.models import kernel_choice, linear
from adaserve_backend.models.kernel_choice import ALL_ROWS, choose, crossover
from tests.model_fixtures import our_model, tiny_checkpoint

ops = linear.kernels()
needs_pairs = pytest.mark.skipif(ops is None or not ops.pair_gemm or not linear.prepacking_available(
    torch.zeros(1, dtype=torch.bfloat16)), reason="the pair kernel and oneDNN's bf16 packing both needed")


def timings(pairs: dict[int, float], onednn: dict[int, float], amx: dict[int, float] | None = None):
    out = {"pairs": pairs, "onednn": onednn}
    return out | ({"amx": amx} if amx else {})


ROWS = (1, 8, 16, 32, 256)
# An AMX Xeon's shape: the pair kernel ahead up to 8 rows, oneDNN's tiles from 16.
XEON = timings(dict(zip(ROWS, (13, 21, 32, 50, 300))), dict(zip(ROWS, (20, 25, 25, 26, 102))))


def test_crossover_is_where_onednn_wins_from_there_on():
    assert crossover(XEON) == 8
    assert crossover(timings({1: 1, 8: 2}, {1: 2, 8: 3})) == ALL_ROWS  # never loses
    assert crossover(timings({1: 2, 8: 3}, {1: 1, 8: 2})) == 0  # loses everywhere
    # oneDNN ahead at 8 rows only: not for good, the pair kernel keeps it
    assert crossover(timings({1: 1, 8: 3, 16: 4}, {1: 2, 8: 2, 16: 5})) == ALL_ROWS


def test_batch_invariant_plans_serve_every_row_count_with_one_kernel():
    plan = choose(XEON, batch_invariant=True)
    assert plan.plan == "pairs" and plan.pair_rows == ALL_ROWS and plan.batch_invariant
    fast = choose(XEON, batch_invariant=False)
    assert fast.plan == "pairs+onednn" and fast.pair_rows == 8 and not fast.batch_invariant
    assert [fast.cost(r) for r in ROWS] == [13, 21, 25, 26, 102]  # monotone in the rows
    # AMX tiles near the pair kernel at one row and near oneDNN above: one kernel, and the fastest
    amx = XEON | {"amx": dict(zip(ROWS, (14, 16, 18, 22, 100)))}
    assert choose(amx, batch_invariant=True).plan == "amx"
    assert choose(amx, batch_invariant=False).plan == "amx"
    assert "amx (every row count)" in choose(amx, batch_invariant=True).describe()


def test_config_rejects_what_it_does_not_know():
    assert EngineConfig.from_dict({"kernels": {"batch_invariant": False}}).kernels == KernelConfig(False)
    with pytest.raises(ValueError, match="unknown keys"):
        EngineConfig.from_dict({"kernels": {"crossover": 16}})
    with pytest.raises(ValueError, match="true or false"):
        KernelConfig(batch_invariant="yes")


@needs_pairs
def test_a_rows_numbers_do_not_depend_on_the_rows_beside_it():
    """Under every batch-invariant plan this CPU offers, row i of a 200-row product (a prefill's shape) is
    bit for bit the same row alone, inside a 5-row and inside a 37-row one (a tree's): the AMX kernel
    tiles those three differently. An odd number of column blocks leaves a remainder group."""
    torch.manual_seed(0)
    layer = linear.Linear(576, 1520, bias=False).bfloat16()
    layer.prepack()
    x = torch.randn(200, 576).bfloat16()
    plans = [(ALL_ROWS, False)] + ([(ALL_ROWS, True)] if ops.amx_compiled and ops.amx_permitted() else [])
    with torch.inference_mode():
        for pair_rows, amx in plans:
            ops.set_kernel_choice(pair_rows, amx)
            whole = layer(x)
            tree = layer(x[:37])
            for i in (0, 3, 36):
                assert torch.equal(layer(x[i:i + 1]), whole[i:i + 1])
                assert torch.equal(layer(x[max(0, i - 2):i + 3])[min(i, 2)], whole[i])
                assert torch.equal(tree[i], whole[i])


@needs_pairs
def test_apply_measures_and_sets_the_choice_for_the_process():
    model = our_model(tiny_checkpoint("llama"), "bfloat16")
    choice = kernel_choice.apply(model, KernelConfig())
    assert choice is not None and set(choice.timings) >= {"pairs", "onednn"}
    assert ops.kernel_choice() == (choice.pair_rows, choice.amx)
    assert choice.batch_invariant
    assert kernel_choice.apply(model, KernelConfig(measure=False)) == kernel_choice.DEFAULT
    assert kernel_choice.apply(torch.nn.Linear(4, 4), KernelConfig()) is None  # nothing to choose


@pytest.mark.skipif(ops is None or not (ops.amx_compiled and ops.amx_permitted()), reason="a CPU with AMX-BF16")
def test_amx_tiles_compute_the_product_for_every_row_count():
    torch.manual_seed(0)
    for k, n in ((32, 16), (96, 80), (576, 960)):
        w = torch.randn(n, k).bfloat16()
        pairs = ops.pack_pairs(w)
        for m in (1, 2, 15, 16, 17, 33):
            x = torch.randn(m, k).bfloat16()
            ref = (x.float() @ w.float().T).bfloat16().float()
            torch.testing.assert_close(ops.amx_linear(x, pairs, None).float(), ref, rtol=1e-2, atol=1e-2)
