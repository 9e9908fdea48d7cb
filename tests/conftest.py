import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session", autouse=True)
def machine_cache(tmp_path_factory):
    """What the project keeps per machine (calibrations the served engine pools, GGUF conversions) goes to
    a temporary folder: engines started under the suite's load must not join the machine's calibration
    record, which `make serve` later fits its rooflines to."""
    root = tmp_path_factory.mktemp("adaserve-cache")
    with pytest.MonkeyPatch.context() as patch:  # restores the user's setting after the session
        patch.setenv("ADASERVE_CACHE_DIR", str(root))
        yield root


@pytest.fixture(scope="session", autouse=True)
def checkpoint_root(tmp_path_factory):
    """Tiny checkpoints (tests/model_fixtures.py) go to pytest's temporary folders, cleaned up with them."""
    from tests import model_fixtures

    model_fixtures.CHECKPOINT_ROOT = tmp_path_factory.mktemp("checkpoints")
    yield model_fixtures.CHECKPOINT_ROOT


@pytest.fixture(autouse=True)
def default_kernel_choice():
    """Every engine sets which CPU kernel serves bfloat16 products for the whole process
    (models/kernel_choice.py). Where AMX tiles win, that choice outlived the test that made it, and a
    later test comparing two kernels' bits (the quantized blocks against the pair kernel) saw AMX
    instead: each test starts from the default, wherever an earlier one loaded the kernels."""
    yield
    import sys

    linear = sys.modules.get("adaserve_backend.models.linear")
    ops = linear.kernels() if linear is not None else None
    if ops is not None:
        from adaserve_backend.models.kernel_choice import DEFAULT

        ops.set_kernel_choice(DEFAULT.pair_rows, DEFAULT.amx)
