import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session", autouse=True)
def checkpoint_root(tmp_path_factory):
    """Tiny checkpoints (tests/model_fixtures.py) go to pytest's temporary folders, cleaned up with them."""
    from tests import model_fixtures

    model_fixtures.CHECKPOINT_ROOT = tmp_path_factory.mktemp("checkpoints")
    yield model_fixtures.CHECKPOINT_ROOT
