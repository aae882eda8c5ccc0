"""``mdsl-opt --verify-backward``: the written backward, or the derived gradient, against float64
finite differences (spec 9.8.1)."""

import re

import numpy as np
import pytest
from written_backward_sources import TWO_LAYER

import modeldsl
from modeldsl import vjp
from modeldsl.resolve.imports import STD_ROOT
from modeldsl.tools.opt import main

TINY_LLAMA = "vocab_size=64,d_model=32,n_layers=2,num_heads=4,num_kv_heads=2,d_ff=48"


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def table(out: str) -> dict[str, float]:
    """tensor name -> relative error, from the printed table."""
    rows = {}
    for line in out.splitlines():
        match = re.match(r"^(\S.*?)\s+(-?\d\.\d+e[+-]\d+)\s+(-?\d\.\d+e[+-]\d+)\s+(\d\.\d+e[+-]\d+)( +FAIL)?$", line)
        if match:
            rows[match[1]] = float(match[4])
    return rows


@pytest.mark.parametrize("derived", [False, True])
@pytest.mark.parametrize("file, top, shapes, tensors", [
    ("modules/linear.module", "Linear", "in_dim=4,out_dim=3", {"weight", "input in"}),
    ("modules/mlp.module", "SwiGLU_MLP", "d_model=8,d_ff=12", {"up_weight", "down_weight", "input in"}),
])
def test_a_std_module_passes(capsys, file, top, shapes, tensors, derived):
    """Their written backward: sections by default, the derived gradient with --verify-derived."""
    code, out, err = run(capsys, str(STD_ROOT / file), "--top", top, "--verify-backward", "--verify-shapes", shapes,
                         *(["--verify-derived"] if derived else []))
    assert code == 0, err
    sizes = shapes.replace(",", ", ")
    what = "the derived gradient (mdsl-autodiff)" if derived else "the written backward @backward"
    assert out.startswith(f"verify-backward @{top} (B=2, T=8, {sizes}; float64, epsilon 1e-06, seed 0): {what}\n")
    column = "derived" if derived else "written"
    assert out.splitlines()[1].split() == ["tensor", column, "numerical", "rel.", "error"]
    rows = table(out)
    assert set(rows) == tensors and max(rows.values()) < 1e-6
    assert "within the tolerance 0.001" in out and "FAIL" not in out


def test_the_llama_model_with_tiny_sizes_passes(capsys):
    """Model parameters named in --verify-shapes are lowering values (the 7B defaults would not fit)."""
    code, out, err = run(capsys, str(STD_ROOT / "models" / "llama.module"), "--verify-backward",
                         "--verify-shapes", f"B=1,T=6,{TINY_LLAMA}")
    assert code == 0, err
    assert out.startswith("verify-backward @Llama (B=1, T=6, vocab_size=64, d_model=32, n_layers=2,")
    rows = table(out)
    assert set(rows) == {"embedding", "blocks.ln1.weight", "blocks.attention.qkv_weight", "blocks.attention.out_weight",
                         "blocks.ln2.weight", "blocks.mlp.up_weight", "blocks.mlp.down_weight", "final_norm.weight",
                         "lm_head"}
    assert max(rows.values()) < 1e-6


@pytest.mark.parametrize("case", ["qwen3-qk-norm", "mistral-sliding-window", "llama-tied"])
def test_a_checkpoint_config_gives_the_sizes(capsys, tmp_path, case):
    from hf_checkpoints import CASES, make_checkpoint

    arch, module, config = CASES[case]
    path = make_checkpoint(tmp_path / case, arch, **config)
    code, out, err = run(capsys, str(STD_ROOT / "models" / module), "--hf", str(path), "--verify-backward",
                         "--verify-shapes", "T=12")
    assert code == 0, err
    rows = table(out)
    assert max(rows.values()) < 1e-5
    assert ("blocks.attention.q_norm" in rows) == (case == "qwen3-qk-norm")
    assert ("lm_head" in rows) == (case != "llama-tied")


def test_a_broken_rule_fails_with_exit_code_1(capsys, monkeypatch):
    """A VJP rule that doubles its gradient (swiglu's d_gate) is caught: the tensors whose gradient
    passes through it are marked FAIL (in the derived gradient: the module's written backward does
    not use the rule)."""
    right = vjp.RULES["swiglu"]

    def doubled(b, op, grads):
        d_gate, d_up = right(b, op, grads)
        return [b.one("scale", d_gate, factor=2.0), d_up]

    monkeypatch.setitem(vjp.RULES, "swiglu", doubled)
    args = [str(STD_ROOT / "modules" / "mlp.module"), "--top", "SwiGLU_MLP", "--verify-backward",
            "--verify-shapes", "d_model=8,d_ff=12"]
    code, out, err = run(capsys, *args)
    assert code == 0 and "the written backward @backward" in out, err
    code, out, err = run(capsys, *args, "--verify-derived")
    assert code == 1
    rows = table(out)
    assert rows["down_weight"] < 1e-6  # its gradient does not pass through swiglu
    assert rows["up_weight"] > 1e-3 and rows["input in"] > 1e-3
    fails = [line.split()[0] for line in out.splitlines() if line.endswith("FAIL")]
    assert fails == ["up_weight", "input"]
    assert "above the tolerance 0.001" in out


def test_the_tolerance_decides_the_exit_code(capsys):
    args = [str(STD_ROOT / "modules" / "linear.module"), "--top", "Linear", "--verify-backward",
            "--verify-shapes", "in_dim=4,out_dim=3", "--verify-epsilon", "1e-3"]
    code, out, _ = run(capsys, *args)
    assert code == 0 and "within the tolerance 0.001" in out
    code, out, _ = run(capsys, *args, "--verify-tolerance", "1e-30")
    assert code == 1 and "FAIL" in out and "above the tolerance 1e-30" in out


def test_ir_input_is_checked_too(capsys, tmp_path):
    source = tmp_path / "m.mlir"
    source.write_text("""
!x = !mdsl.graph.tensor<[B, d], fp32>
!w = !mdsl.graph.tensor<[d, d], fp32>
mdsl.graph.model @M config {d = 3 : i64} {
  mdsl.graph.param @w : !w
  mdsl.graph.func @forward(%x: !x) -> !x attributes {kind = "forward"} {
    %w = mdsl.graph.param_ref @w : !w
    %h = mdsl.graph.matmul %x, %w {transpose = "NT"} : (!x, !w) -> !x
    %y = mdsl.graph.gelu %h : (!x) -> !x
    mdsl.graph.return %y : !x
  }
}
""")
    code, out, err = run(capsys, str(source), "--verify-backward", "--verify-shapes", "B=5,d=6")
    assert code == 0, err
    assert out.startswith("verify-backward @M (B=5, T=8, d=6;")
    assert set(table(out)) == {"w", "input x"}




def test_a_written_backward_passes(capsys, tmp_path):
    (tmp_path / "m.module").write_text(TWO_LAYER)
    code, out, err = run(capsys, str(tmp_path / "m.module"), "--verify-backward", "--verify-shapes", "B=3,d=5")
    assert code == 0, err
    assert out.startswith("verify-backward @TwoLayer (B=3, T=8, d=5; float64, epsilon 1e-06, seed 0): "
                          "the written backward @backward\n")
    rows = table(out)
    assert set(rows) == {"w", "input x"} and max(rows.values()) < 1e-6
    assert "within the tolerance 0.001" in out and "FAIL" not in out


def test_a_wrong_written_backward_fails_with_exit_code_1(capsys, tmp_path):
    """d_x through a transposed weight: its row FAILs, the exit code is 1; the derived gradient
    of the same forward (--verify-derived) passes."""
    (tmp_path / "m.module").write_text(TWO_LAYER.replace("(d_h, w) -> matmul(transpose=NN) -> d_x",
                                                       "(d_h, w) -> matmul(transpose=NT) -> d_x"))
    code, out, err = run(capsys, str(tmp_path / "m.module"), "--verify-backward")
    assert code == 1, err
    assert "the written backward @backward" in out.splitlines()[0]
    rows = table(out)
    assert rows["input x"] > 1e-3 and rows["w"] < 1e-6
    assert [line.split()[0] for line in out.splitlines() if line.endswith("FAIL")] == ["input"]
    assert "above the tolerance 0.001" in out
    code, out, err = run(capsys, str(tmp_path / "m.module"), "--verify-backward", "--verify-derived")
    assert code == 0, err
    assert "the derived gradient (mdsl-autodiff)" in out.splitlines()[0] and "FAIL" not in out


TWO_LAYER_IR = """
!x = !mdsl.graph.tensor<[*, d], fp32>
!w = !mdsl.graph.tensor<[d, d], fp32>
!b = !mdsl.graph.tensor<[d], fp32>
mdsl.graph.model @M config {d = 3 : i64} {
  mdsl.graph.param @w : !w
  mdsl.graph.param @b : !b
  mdsl.graph.func @forward(%x: !x) -> !x attributes {kind = "forward"} {
    %w = mdsl.graph.param_ref @w : !w
    %b = mdsl.graph.param_ref @b : !b
    %h = mdsl.graph.matmul %x, %w {transpose = "NT"} : (!x, !w) -> !x
    %y = mdsl.graph.bias_add %h, %b : (!x, !b) -> !x
    mdsl.graph.return %y : !x
  }
  mdsl.graph.func @backward(%d_y: !x, %saved_x: !x) -> (!x, !w, !b) attributes {kind = "backward", SAVED, GRADS} {
    %w = mdsl.graph.param_ref @w : !w
    %d_x = mdsl.graph.matmul %d_y, %w : (!x, !w) -> !x
    %d_w = mdsl.graph.matmul %d_y, %saved_x {transpose = "TN"} : (!x, !x) -> !w
    %d_b = mdsl.graph.reduce_sum %d_y {dims = array<i64: 0>} : (!x) -> !b
    mdsl.graph.return %d_x, %d_w, %d_b : !x, !w, !b
  }
}
"""


@pytest.mark.parametrize("x, saved, grads, code, message", [
    ("[B, d]", 'saved = ["x"]', 'grads = ["d_x", "d_w", "d_b"]', 0, ""),
    ("[*, d]", 'saved = ["x"]', 'grads = ["d_x", "d_w", "d_b"]', 0, ""),
    ("[*, d]", 'saved = ["x"]', 'grads = ["d_x", "d_w", "d_b"]', "E018",
     "the written gradient of b has shape (2, 5), the tensor (3,)"),
    ("[B, d]", 'saved = ["h2"]', 'grads = ["d_x", "d_w", "d_b"]', "E006",
     "@backward of @M reads saved.h2, but no input or value of @forward is named 'h2'"),
    ("[B, d]", 'saved = ["x"]', 'grads = ["d_x", "d_v", "d_b"]', "E005",
     "@backward of @M returns 'd_v', the gradient of no float input of @forward nor parameter"),
])
def test_a_written_backward_in_ir_and_what_cannot_be_checked(capsys, tmp_path, x, saved, grads, code, message):
    """A hand-written @backward in IR is checked too (reduce_sum(dims=[0]) over [*, d] sums every axis
    '*' stands for: B and T here); one the check cannot run is a coded error (a gradient of the wrong
    shape: reduce_sum(dims=[1]) over [*, d], which is [B, T, d], leaves [B, T])."""
    source = tmp_path / "m.mlir"
    text = TWO_LAYER_IR.replace("[*, d]", x).replace("SAVED", saved).replace("GRADS", grads)
    if code == "E018":
        text = text.replace("dims = array<i64: 0>", "dims = array<i64: 1>")
    source.write_text(text)
    exit_code, out, err = run(capsys, str(source), "--verify-backward", "--verify-shapes", "B=2,T=5")
    if not code:
        assert exit_code == 0, err
        assert "the written backward @backward" in out and set(table(out)) == {"w", "b", "input x"}
        return
    assert exit_code == 1 and out == ""
    assert err.startswith(f"error[{code}]: --verify-backward: {message}"), err
    assert "Traceback" not in err and "hint:" in err


@pytest.mark.parametrize("args, message", [
    (["--verify-shapes", "B=x"], "--verify-shapes: B=x is not an integer"),
    (["--verify-shapes", "B"], "--verify-shapes: 'B' is not NAME=SIZE"),
    (["--verify-shapes", "T=0"], "--verify-shapes: T=0 is not a positive size"),
    (["--verify-shapes", "tie_embeddings=1"], "tie_embeddings is a bool parameter of Llama, not a size"),
    (["--verify-shapes", "nope=3"], "nope is neither a symbol nor a config value of @Llama"),
    (["--verify-tolerance", "abc"], "--verify-tolerance 'abc' is not a number"),
    (["--verify-tolerance", "-1"], "--verify-tolerance must be a finite number above 0"),
    (["--verify-epsilon", "0"], "--verify-epsilon must be a finite number above 0"),
    (["--verify-epsilon", "inf"], "--verify-epsilon must be a finite number above 0"),
    (["--emit=ast"], "--verify-backward prints the gradient check, not --emit=ast"),
    ([], "@Llama has 6,"),  # the default 7B sizes: too large for the check
])
def test_bad_flags_are_e029_without_a_traceback(capsys, args, message):
    code, out, err = run(capsys, str(STD_ROOT / "models" / "llama.module"), "--verify-backward", *args)
    assert code == 1
    assert err.startswith("error[E029]: ") and message in err, err
    assert "Traceback" not in err and "hint:" in err


def test_verify_options_need_verify_backward(capsys):
    code, _, err = run(capsys, str(STD_ROOT / "models" / "llama.module"), "--verify-shapes", "B=2")
    assert code == 1 and "error[E029]: --verify-shapes is an option of --verify-backward" in err
    code, _, err = run(capsys, str(STD_ROOT / "models" / "llama.module"), "--verify-derived")
    assert code == 1 and "error[E029]: --verify-derived is an option of --verify-backward" in err


def test_the_help_documents_verify_derived(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--verify-derived" in out and "written backward" in out


def test_unbound_sizes_are_named(capsys):
    code, _, err = run(capsys, str(STD_ROOT / "modules" / "linear.module"), "--top", "Linear", "--verify-backward")
    assert code == 1
    assert "error[E029]: --verify-backward: the shapes of @Linear still hold in_dim, out_dim" in err
    assert "--verify-shapes B=2,T=8,in_dim=4,out_dim=4" in err


def test_verify_backward_is_callable_from_the_package():
    from modeldsl.verify_backward import GradientCheck, random_inputs, random_weights  # the submodule stays callable

    model = modeldsl.load(STD_ROOT / "models" / "llama.module",
                          config={k: int(v) for k, v in (item.split("=") for item in TINY_LLAMA.split(","))})
    checks = modeldsl.verify_backward(model.model, random_weights(model.model),
                                      random_inputs(model.model, sizes={"B": 1, "T": 4}))
    assert all(isinstance(c, GradientCheck) for c in checks)
    assert max(c.relative_error for c in checks) < 1e-6
    assert modeldsl.verify_backward.report(checks, 1e-3)[1]
    assert np.isfinite([c.derived for c in checks]).all()


def test_a_nan_error_fails_wherever_it_is_in_the_table():
    from modeldsl.verify_backward import GradientCheck, report

    checks = [GradientCheck("a", 1.0, 1.0), GradientCheck("b", float("nan"), 1.0), GradientCheck("c", 2.0, 2.0)]
    text, ok = report(checks, 1e-3)
    assert not ok and "max relative error nan (above" in text and text.count("FAIL") == 1


def test_a_zero_gradient_is_held_to_the_rounding_noise_not_to_a_relative_error():
    from modeldsl.verify_backward import GradientCheck, report

    noise = 1e-6
    zero = GradientCheck("zero", 4.7e-16, 2.8e-8, noise=noise)  # both zero up to rounding
    wrong = GradientCheck("wrong", 0.0, 5e-6, noise=noise)      # a gradient the backward misses
    sized = GradientCheck("sized", 1.0, 1.0 + 3e-3, noise=noise)  # off by 3e-3 relative
    text, ok = report([zero, GradientCheck("w", 2.0, 2.0, noise=noise)], 1e-3)
    assert ok and "(zero: rounding noise)" in text and "max relative error 0.00e+00 (within" in text
    assert not report([zero, wrong], 1e-3)[1] and not report([sized], 1e-3)[1]


def test_qwen3_qk_norm_gradients_that_are_zero_pass(capsys):
    """At d_model=8 the std Qwen3's head_dim is 1: RMS-normalizing one value gives ±1 whatever
    its weight, so the q/k norm weights get no gradient, and the finite difference sees noise."""
    code, out, err = run(capsys, str(STD_ROOT / "models" / "qwen.module"), "--verify-backward",
                         "--verify-shapes", "B=1,T=2,d_model=8,n_layers=1")
    assert code == 0, err
    assert "blocks.attention.q_norm" in out and "FAIL" not in out and "rounding noise" in out


def test_sizes_that_make_a_parameter_empty_are_e029(capsys):
    code, out, err = run(capsys, str(STD_ROOT / "models" / "llama.module"), "--verify-backward",
                         "--verify-shapes", "B=1,T=2,d_model=8,n_layers=1")
    assert code == 1 and "error[E029]" in err and "qkv_weight" in err and "internal error" not in err


@pytest.mark.parametrize("file, top, shapes, tensors", [
    ("modules/moe/expert.module", "SparseMoE_MLP", "d_model=4,d_ff=3,num_experts=3,top_k=2",
     {"router", "experts_gate", "experts_up", "experts_down", "input in", "input assigned", "input probs", "input z"}),
    ("blocks/mamba.module", "MambaBlock", "d_model=4,d_inner=6,d_state=3,dt_rank=2",
     {"norm.weight", "in_proj", "conv_weight", "conv_bias", "x_proj", "dt_proj", "dt_bias", "A_log", "D", "out_proj",
      "input in"}),
])
def test_the_std_moe_and_mamba_blocks_pass(capsys, file, top, shapes, tensors):
    """Their derived gradients (router, permutation, grouped GEMMs; causal conv, selective scan)."""
    code, out, err = run(capsys, str(STD_ROOT / file), "--top", top, "--verify-backward", "--verify-shapes", shapes)
    assert code == 0, err
    rows = table(out)
    assert set(rows) == tensors and max(rows.values()) < 1e-6, out


DROPOUT_MODEL = """
block Blk(d: int = 8):
  params:
    w: [d, d]
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      x -> matmul(w, transpose=NT) -> h
      h -> dropout(p=0.4, seed=3) -> a
      a -> silu() -> s
      (x, s) -> add() -> out

model Dropped(d: int = 8, n: int = 3):
  params:
    blocks: [n] x Blk(d)
    head: [d, d]
  forward:
    in: x: [B, d]
    out: [B, d]
    graph:
      x -> dropout(p=0.25, seed=1) -> x0
      x0 -> blocks -> xN
      xN -> matmul(head, transpose=NT) -> out
"""


def test_a_model_with_dropout_in_training_passes(capsys, tmp_path):
    """The derived gradient is the training forward's (its dropouts active, each layer's mask its own):
    the finite differences are taken of that forward, with the same step counter, so they differ
    through the same masks and agree."""
    path = tmp_path / "dropped.module"
    path.write_text(DROPOUT_MODEL)
    code, out, err = run(capsys, str(path), "--verify-backward")
    assert code == 0, out + err
    rows = table(out)
    assert set(rows) == {"blocks.w", "head", "input x"} and max(rows.values()) < 1e-6, out
