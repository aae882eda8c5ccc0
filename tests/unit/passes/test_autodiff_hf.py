"""mdsl-autodiff against PyTorch autograd through transformers (issue 6).

For tiny random transformers checkpoints of Llama (GQA, tied embeddings,
Llama-3 and YaRN rope scaling), Qwen3 (QK-norm) and Mistral (a sliding window
smaller than the sequence), the derived gradient function, run by the graph
interpreter in fp32 with the cotangent of a mean cross-entropy over shifted
labels (taken from torch: ``logits.grad`` of transformers' own loss), gives
every parameter's gradient as ``loss.backward()`` does (the MLP's through
SwiGLU_MLP's written backward, which the derived gradient calls in every
layer; the rest by the VJP rules): the DSL gradients are
mapped to HF names through the checkpoint export path (fused QKV and gate/up
split back, stacked layers unstacked; a tied LM head's gradient is already
summed into the embedding's, as PyTorch sums the uses of its one shared
parameter), and each tensor's max |a - b| / max |b| is at most 1e-4.
"""

import numpy as np
import pytest
from hf_checkpoints import CASES, make_checkpoint, transformers_model

import modeldsl
from modeldsl.dialects.graph import CallOp, StackOp
from modeldsl.hf.checkpoint import ImportRecord, hf_tensors
from modeldsl.passes.autodiff import gradient_function
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.runtime.executor import GraphExecutor

torch = pytest.importorskip("torch")

TOLERANCE = 1e-4
B, T = 2, 12  # T above the Mistral case's window (5)


# transformers keeps MoE experts as fused gate_up_proj / down_proj parameters, not the checkpoint's per-expert
# tensors the export path names: test_moe_models compares those gradients
DENSE_OR_SSM = sorted(name for name in CASES if "moe" not in name)


@pytest.fixture(scope="module", params=DENSE_OR_SSM)
def case(request, tmp_path_factory):
    arch, module, config = CASES[request.param]
    path = make_checkpoint(tmp_path_factory.mktemp(request.param), arch, **config)
    return request.param, module, path


def layers_per_step(model, stack) -> int:
    """The decoder layers a step of ``stack`` runs: one, or those of a block of several (Gemma 2's layer pairs,
    Gemma 3's groups of six), each with an input_norm."""
    name = stack.body.root_reference.data.removesuffix("_bwd")
    return max(1, sum(1 for weight in model.weights if weight.startswith(f"{name}.")
                      and weight.endswith(".input_norm.weight") and weight.count(".") == name.count(".") + 3))


def derived_gradients(module: str, path, tokens: np.ndarray, d_logits: np.ndarray):
    """(logits, {HF tensor name: gradient}) of the derived ``@forward_grad`` in fp32."""
    model = modeldsl.load(STD_ROOT / "models" / module, hf=path, dtype="fp32")
    grad_func = gradient_function(model.model, "forward")
    # SwiGLU_MLP's written backward computes the MLP's gradients, once in the block backward
    # that a reverse stack runs for every layer (Qwen2's full and windowed layers: two stacks)
    stacks = [op for op in grad_func.body.block.ops if isinstance(op, StackOp) and op.reverse is not None]
    for stack in stacks:
        block_backward = model.model.lookup(stack.body.root_reference.data)
        backward_calls = [op.callee.root_reference.data for op in block_backward.walk() if isinstance(op, CallOp)]
        name = stack.body.root_reference.data.removesuffix("_bwd")
        # stacks of one MLP share its backward function; Gemma's GeGLU MLP has no written backward
        written = f"{name}.mlp.up_weight" in model.weights and not module.startswith("gemma")
        assert [call.endswith("_mlp_backward") for call in backward_calls] == ([True] if written else []), name
    assert sum(stack.count.data.evaluate({}) * layers_per_step(model, stack) for stack in stacks) \
        == model.config("n_layers")
    executor = GraphExecutor(model.model, model.weights, np.float32)
    results = executor.run(grad_func.sym_name.data, *model.inputs(tokens, 0), d_logits)
    names = [a.data for a in grad_func.attributes["grads"].data]
    assert len(results) == 1 + len(names)  # logits, d_params; no d_inputs (token ids, RoPE table)
    grads = dict(zip(names, results[1:]))
    assert set(grads) == set(model.weights)  # every parameter gets a gradient
    # the export path of save_hf, without the loaded arrays (so nothing is taken as "unchanged")
    record = ImportRecord(model.record.source, model.record.reads)
    return results[0], hf_tensors(model.model, grads, record, np.dtype(np.float32))


def test_every_parameter_gradient_equals_pytorch_autograd(case):
    name, module, path = case
    tokens = np.random.default_rng(0).integers(0, 64, size=(B, T))
    hf = transformers_model(path)
    ids = torch.tensor(tokens)
    out = hf(ids, labels=ids)  # mean cross-entropy of logits[:, :-1] against tokens[:, 1:]
    out.logits.retain_grad()
    out.loss.backward()
    expected_logits = out.logits.detach().numpy()
    logits, grads = derived_gradients(module, path, tokens, out.logits.grad.numpy())

    np.testing.assert_allclose(logits, expected_logits, atol=1e-4, rtol=0)
    params = dict(hf.named_parameters())
    assert set(grads) == set(params)
    errors = {}
    for tensor, param in params.items():
        assert param.dtype == torch.float32 and param.grad is not None, tensor
        expected = param.grad.numpy()
        assert grads[tensor].shape == expected.shape, tensor
        scale = np.abs(expected).max()
        assert scale > 0, tensor
        errors[tensor] = float(np.abs(grads[tensor] - expected).max() / scale)
    worst = max(errors, key=errors.get)
    bad = {t: e for t, e in errors.items() if e > TOLERANCE}
    assert not bad, f"{name}: relative errors above {TOLERANCE}: {bad}"
    print(f"{name}: max relative error {errors[worst]:.2e} ({worst}, {len(errors)} tensors)")


def test_a_tied_lm_head_gradient_is_summed_into_the_embedding(tmp_path):
    """transformers ties lm_head.weight to embed_tokens.weight (one Parameter, whose grad sums
    both uses); the DSL has no lm_head parameter and its embedding gradient holds both."""
    path = make_checkpoint(tmp_path / "tied", "llama", tie_word_embeddings=True)
    hf = transformers_model(path)
    assert hf.lm_head.weight is hf.model.embed_tokens.weight
    assert "lm_head.weight" not in dict(hf.named_parameters())
    tokens = np.array([[1, 2, 3, 4, 5, 6]])
    d_logits = np.random.default_rng(1).standard_normal((1, 6, 64)).astype(np.float32)
    _, grads = derived_gradients("llama.module", path, tokens, d_logits)
    assert "lm_head.weight" not in grads
    # rows of tokens the batch never reads still get the LM head's gradient
    unused = [t for t in range(64) if t not in tokens]
    assert np.abs(grads["model.embed_tokens.weight"][unused]).max() > 0
