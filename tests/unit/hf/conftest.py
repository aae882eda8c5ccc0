"""A tiny random Llama checkpoint for the HF import/export tests."""

import pytest

from hf_checkpoints import make_checkpoint

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("tiny_llama"))
