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
