"""A tiny random Llama checkpoint for the HF import/export tests (built once per session, shared
with every test that asks :func:`cached_checkpoint` for it; copy it before changing it)."""

import pytest
from hf_checkpoints import cached_checkpoint

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def tiny_llama():
    return cached_checkpoint("llama")
