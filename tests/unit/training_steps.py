"""What the training-step tests of the passes share: the std families on tiny transformers
checkpoints, and the loss and gradients of one fp32 step of a compiled program on the CPU."""

import numpy as np
from hf_checkpoints import cached_checkpoint

import modeldsl
from modeldsl.resolve.imports import STD_ROOT

FAMILIES = [("llama", "llama.module", {}), ("qwen3", "qwen.module", {"head_dim": 16}),
            ("mistral", "mistral.module", {"sliding_window": 5})]
FAMILY_IDS = [f[0] for f in FAMILIES]
BATCH, TOKENS = 2, 8


def load_std(arch: str, module: str, config: dict, root=STD_ROOT / "models"):
    """A std model (or one under ``root``) on a tiny checkpoint of ``arch``, in fp32."""
    return modeldsl.load(root / module, hf=cached_checkpoint(arch, **config), dtype="fp32")


def step_gradients(model, program, ignored: int = 0) -> tuple[float, np.ndarray]:
    """(loss, the grads arena as fp32) of one step of ``program`` on fixed random tokens, the first
    ``ignored`` labels of the first row -100."""
    executor = model.schedule.executor(program)
    executor.arenas["grads"][:] = 0
    rng = np.random.default_rng(0)
    vocab = model.config("vocab_size")
    tokens = rng.integers(0, vocab, size=(BATCH, TOKENS)).astype(np.int32)
    labels = rng.integers(0, vocab, size=(BATCH, TOKENS)).astype(np.int64)
    labels[0, :ignored] = -100
    (loss, *_) = executor.execute(*model.inputs(tokens, 0), labels, np.array(1.0, dtype=np.float32))
    return float(loss), executor.arenas["grads"].copy().view(np.float32)
