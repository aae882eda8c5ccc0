"""No input reaches the catch-all of mdsl-opt or mdsl-run, and none hangs (issue 13 item 3).

Seeded mutants (``fuzz_inputs``) of the std models, the FileCheck inputs and
the tiny checkpoint run in process, each under a 5 s time bound: every run
either succeeds or fails with a coded diagnostic (``error[EXXX]``); an
exception behind the catch-all, a hang or an error without a code fails the
test, which prints each kind once with its input and the command that
reproduces it. The default run draws a few hundred cases per kind (mdsl-opt on
mutated .module and .mlir files, through random pass pipelines and with a
mutated --hf config; mdsl-run on mutated checkpoints, models and flags); the
slow one draws 600 per kind and seed. Every kind of failure found so far is
pinned by its smallest input (FOUND).
"""

import io
import json
import sys
from collections import Counter

import numpy as np
import pytest
from fuzz_inputs import (
    CHECKPOINT_FILES,
    CORPUS,
    DEEP_SENTINEL,
    DIR,
    FIFO,
    FILECHECK,
    HUGE_SENTINEL,
    KINDS,
    LLAMA,
    STD,
    TINY_LLAMA,
    Case,
    CaseMaker,
    campaign,
    dump_json,
    failures,
    join_safetensors,
    report,
    run_case,
    split_safetensors,
)

SEED = 13
COUNTS = {"dsl": 200, "mlir": 200, "checkpoint": 100, "run-dsl": 80, "pipeline": 200, "run-flags": 80,
          "opt-hf": 60, "lock": 60}
TIMEOUT_S = 5.0


def assert_no_failures(outcomes):
    bad = failures(outcomes)
    assert not bad, f"{len(bad)} of {len(outcomes)} mutants failed badly:\n{report(bad)}"


@pytest.mark.parametrize("kind", KINDS)
def test_mutants_get_coded_diagnostics(kind, tmp_path):
    outcomes = campaign(SEED, list(range(COUNTS[kind])), tmp_path, TIMEOUT_S, kinds=[kind])
    assert_no_failures(outcomes)
    statuses = Counter(o.status for o in outcomes)
    # the mutants reach the tool for real: some still run, most are diagnosed
    assert statuses["ok"] > 0 and statuses["coded"] > len(outcomes) // 4, statuses


def test_odd_checkpoint_values_leak_no_numpy_warnings(tmp_path):
    """NaN/Inf weights and odd rms_norm_eps/rope_theta are W011 warnings, never numpy's RuntimeWarnings."""
    outcomes = campaign(SEED, list(range(20)), tmp_path, TIMEOUT_S, kinds=["values"])
    assert_no_failures(outcomes)
    leaked = [f"{w}\n    input: {o.case.label}" for o in outcomes for w in o.leaked_warnings]
    assert not leaked, "\n".join(leaked[:10])
    assert any("W011" in o.output for o in outcomes)


def test_training_mutants_get_coded_diagnostics(tmp_path):
    """``mdsl-run --train`` for a step on mutated training text with random training flags."""
    outcomes = campaign(SEED, list(range(30)), tmp_path, TIMEOUT_S, kinds=["train"])
    assert_no_failures(outcomes)
    statuses = Counter(o.status for o in outcomes)
    assert statuses["ok"] > 0 and statuses["coded"] > 0, statuses


def test_resumed_mutants_get_coded_diagnostics(tmp_path):
    """``mdsl-run --train --resume OUT`` of a saved run with a mutated training_state.npz or config.json."""
    outcomes = campaign(SEED, list(range(40)), tmp_path, TIMEOUT_S, kinds=["resume"])
    assert_no_failures(outcomes)
    statuses = Counter(o.status for o in outcomes)
    assert statuses["ok"] > 0 and statuses["coded"] > 0, statuses


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("kind", KINDS)
def test_many_mutants_get_coded_diagnostics(kind, seed, tmp_path):
    assert_no_failures(campaign(seed, list(range(600)), tmp_path, TIMEOUT_S, kinds=[kind]))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_many_training_mutants_get_coded_diagnostics(seed, tmp_path):
    assert_no_failures(campaign(seed, list(range(200)), tmp_path, TIMEOUT_S, kinds=["train", "resume"]))


# every kind of failure the fuzzer found, as its smallest input (the random draws may miss it next time)

NINES = "9" * 4400  # past Python's 4300-digit int <-> str limit


def llama_with(old: str, new: str) -> bytes:
    text = LLAMA.read_text()
    assert old in text
    return text.replace(old, new).encode()


def opt_case(name: str, text: str | bytes, *flags: str) -> Case:
    data = text.encode() if isinstance(text, str) else text
    return Case("mlir", 0, name, {name: data}, ["{dir}/" + name, *flags])


def run_case_with(label: str, files: dict, *flags: str, model: str = str(LLAMA)) -> Case:
    ckpt = {f"ckpt/{n}": (TINY_LLAMA / n).read_bytes() for n in CHECKPOINT_FILES}
    return Case("checkpoint", 0, label, {**ckpt, **files},
                [model, "--hf", "{dir}/ckpt", *(flags or ("--prompt", "hi")), "--max-new-tokens", "2"])


def config_with(**fields) -> dict:
    config = json.loads((TINY_LLAMA / "config.json").read_text())
    return {"ckpt/config.json": dump_json({**config, **fields}).encode()}


def safetensors_with(name: str, **entry) -> dict:
    header, body = split_safetensors((TINY_LLAMA / "model.safetensors").read_bytes())
    header[name].update(entry)
    return {"ckpt/model.safetensors": join_safetensors(header, body)}


AUTODIFF_MLIR = (FILECHECK / "passes" / "autodiff.mlir").read_text()
FOUND = {
    "string-literal-backtracking": opt_case("x.mlir", 'mdsl.graph.model @m {}\n"' + "a" * 40 + "\n"),
    "mlir-integer-past-4300-digits": opt_case("x.mlir", f"!t = !mdsl.graph.tensor<[{NINES}], fp32>\n"),
    "mlir-dimension-nested-deeply": opt_case("x.mlir", "!t = !mdsl.graph.tensor<[" + "(" * 3000 + "B" + ")" * 3000
                                             + ", 4], fp32>\n"),
    "buffer-dimension-past-i64": opt_case("x.mlir", "mdsl.sched.program @p {\n  %b = mdsl.sched.buffer "
                                          "\"activations\" 0 : !mdsl.sched.buffer<[18446744073709551616], bf16>\n}\n"),
    "lock-file-fifo": Case("lock", 0, "llama.module.lock fifo", {"llama.module": LLAMA.read_bytes(),
                                                                 "llama.module.lock": FIFO},
                           ["{dir}/llama.module", "--locked"]),
    "mlir-array-attribute-nested-deeply": opt_case("x.mlir", "builtin.module attributes {a = " + "[" * 500
                                                   + "]" * 500 + "} {\n}\n"),
    "mlir-regions-nested-deeply": opt_case("x.mlir", "builtin.module {\n" * 1000 + "}\n" * 1000),
    "pass-option-past-4300-digits": opt_case("autodiff.mlir", AUTODIFF_MLIR, "-p", f"mdsl-autodiff{{func={NINES}}}"),
    "non-utf8-mlir": opt_case("x.mlir", b"mdsl.graph.model @m {}\n// \xff\xfe\n"),
    "int-parameter-inf-default": opt_case("llama.module", llama_with("n_layers: int = 32", "n_layers: int = 1e309")),
    "int-parameter-fractional-default": opt_case("llama.module", llama_with("n_layers: int = 32",
                                                                            "n_layers: int = 1.5")),
    "verify-backward-zero-dimension": opt_case("mistral.module", (STD / "models" / "mistral.module").read_bytes(),
                                               "--verify-backward", "--verify-shapes", "B=1,T=2,d_model=8,n_layers=1"),
    "lower-to-sched-zero-rows": opt_case("mistral.module", (STD / "models" / "mistral.module").read_bytes(), "-p",
                                         "mdsl-lower-to-sched", "--verify-backward", "--verify-shapes",
                                         "B=1,T=2,d_model=8,n_layers=1"),
    "input-of-2-tib": run_case_with("freqs 4294967296", {"llama.module": llama_with(
        "freqs: [T, head_dim // 2, 2, fp32]", "freqs: [T, head_dim // 2, 4294967296, fp32]")},
        model="{dir}/llama.module"),
    "freqs-not-a-rope-table": run_case_with("freqs [T, head_dim // 2, 3]", {"llama.module": llama_with(
        "freqs: [T, head_dim // 2, 2, fp32]", "freqs: [T, head_dim // 2, 3, fp32]")}, model="{dir}/llama.module"),
    "freqs-disagree-once-bound": run_case_with("freqs [T, head_dim, 2]", {"llama.module": llama_with(
        "freqs: [T, head_dim // 2, 2, fp32]", "freqs: [T, head_dim, 2, fp32]")}, model="{dir}/llama.module"),
    "fuse-of-nothing": run_case_with("fuse()", {"llama.module": llama_with(
        '"model.layers.{layer}.mlp.gate_proj.weight",\n      "model.layers.{layer}.mlp.up_proj.weight",\n      dim=0',
        "")}, model="{dir}/llama.module"),
    "training-batch-of-1e8": Case("train", 0, "--batch 100000000", {
        "data.txt": b"some training text", **{f"ckpt/{n}": (TINY_LLAMA / n).read_bytes() for n in CHECKPOINT_FILES}},
        [str(LLAMA), "--hf", "{dir}/ckpt", "--train", "{dir}/data.txt", "--steps", "1", "--batch", "100000000",
         "--seq", "8", "--lr", "1e-3"]),
    "training-data-fifo": Case("train", 0, "data.txt fifo", {
        "data.txt": FIFO, **{f"ckpt/{n}": (TINY_LLAMA / n).read_bytes() for n in CHECKPOINT_FILES}},
        [str(LLAMA), "--hf", "{dir}/ckpt", "--train", "{dir}/data.txt", "--steps", "1", "--batch", "1",
         "--seq", "8", "--lr", "1e-3"]),
    "prompt-not-utf8": run_case_with("--prompt \\udcff", {}, "--prompt", "a\udcffb"),
    "safetensors-fifo": run_case_with("fifo", {"ckpt/model.safetensors": FIFO}),
    "config-fifo": run_case_with("fifo", {"ckpt/config.json": FIFO}),
    "config-folder": run_case_with("folder", {"ckpt/config.json": DIR}),
    "tokenizer-folder": run_case_with("folder", {"ckpt/tokenizer.json": DIR}),
    "config-integer-past-4300-digits": run_case_with("vocab_size", config_with(vocab_size=HUGE_SENTINEL)),
    "config-nested-deeply": run_case_with("deep", config_with(extra=DEEP_SENTINEL)),
    "config-integer-past-i64": run_case_with("intermediate_size", config_with(intermediate_size=10**30)),
    "config-layers-1e9": run_case_with("num_hidden_layers", config_with(num_hidden_layers=10**9)),
    "config-head-dim-2-63": run_case_with("head_dim", config_with(head_dim=2**63)),
    "safetensors-shape-2-64": run_case_with("shape", safetensors_with("lm_head.weight", shape=[2**64, 64])),
    "safetensors-shape-fractional": run_case_with("shape", safetensors_with("lm_head.weight", shape=[383.5, 64])),
    "safetensors-header-nested-deeply": run_case_with("deep", safetensors_with("lm_head.weight", x=DEEP_SENTINEL)),
}


@pytest.mark.parametrize("name", FOUND)
def test_found_inputs_get_coded_diagnostics(name, tmp_path):
    outcome = run_case(FOUND[name], tmp_path, TIMEOUT_S)
    assert outcome.status == "coded", outcome.summary() + "\n" + outcome.output[-2000:]


def test_a_parse_error_on_the_first_token_is_located(tmp_path):
    outcome = run_case(opt_case("x.mlir", "! = !mdsl.graph.tensor<[2], bf16>\n"), tmp_path, TIMEOUT_S)
    assert outcome.status == "coded" and "x.mlir:1:1: error[E001]" in outcome.output, outcome.output


def saved_state_with(trained: dict[str, bytes], edit) -> dict[str, bytes]:
    """The saved run's files with ``edit(header, arrays)`` applied to its training_state.npz."""
    with np.load(io.BytesIO(trained["out/training_state.npz"]), allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    header = json.loads(str(arrays["state"]))
    edit(header, arrays)
    arrays["state"] = np.array(dump_json(header))
    out = io.BytesIO()
    np.savez(out, **arrays)
    return {**trained, "out/training_state.npz": out.getvalue()}


def set_run(**values):
    return lambda header, arrays: header["meta"]["run"].update(values)


def set_first_moments(value):
    def edit(header, arrays):
        name = next(k for k in sorted(arrays) if k.startswith("exp_avg."))
        arrays[name] = np.full_like(arrays[name], value) if not isinstance(value, type) else arrays[name].astype(value)
    return edit


FOUND_RESUMED = {
    "state-step-not-a-number": lambda h, a: h.update(step={"x": 1}),
    "state-json-nested-deeply": lambda h, a: h["meta"].update(x=DEEP_SENTINEL),
    "state-batch-negative": set_run(batch=-1),
    "state-seq-fractional": set_run(seq=0.5),
    "state-dtype-a-number": set_run(dtype=-1e308),
    "state-steps-a-list": set_run(steps=[1]),
    "state-data-position-none": lambda h, a: h["meta"].update(data=None),
    "state-data-position-inf": lambda h, a: h["meta"]["data"].update(position=float("inf")),
    "state-rng-negative": lambda h, a: h["meta"]["rng"]["state"].update(state=-1),
    "state-adamw-eps-zero": lambda h, a: h["config"].update(eps=0.0),
    "state-moments-complex": set_first_moments(np.complex64),
    "state-moments-nan": set_first_moments(np.nan),
    "state-moments-huge": set_first_moments(1e38),
}


@pytest.fixture(scope="module")
def trained() -> dict[str, bytes]:
    return CaseMaker(0).trained_run()


@pytest.mark.parametrize("name", FOUND_RESUMED)
def test_found_resumed_inputs_get_coded_diagnostics(name, trained, tmp_path):
    files = {"data.txt": CORPUS.read_bytes()[:2000], **saved_state_with(trained, FOUND_RESUMED[name])}
    case = Case("resume", 0, name, files, [str(LLAMA), "--train", "{dir}/data.txt", "--resume", "{dir}/out"])
    outcome = run_case(case, tmp_path, TIMEOUT_S)
    assert outcome.status in ("coded", "ok"), outcome.summary() + "\n" + outcome.output[-2000:]


# the harness itself: it sees what it must report


def simple_case(tmp_path) -> Case:
    return Case("dsl", 0, "x.module", {"x.module": b"model M():\n"}, ["{dir}/x.module"])


def test_harness_reports_an_exception_behind_the_catch_all(tmp_path, monkeypatch):
    from modeldsl.tools.opt import MdslOptMain

    def broken(self):
        raise KeyError("boom")

    monkeypatch.setattr(MdslOptMain, "run", broken)
    outcome = run_case(simple_case(tmp_path), tmp_path / "case")
    assert outcome.status == "internal"
    assert outcome.error == "KeyError: 'boom'" and "test_fuzz.py" not in outcome.where
    assert failures([outcome]) == [outcome]


def test_harness_reports_a_hang(tmp_path, monkeypatch):
    from modeldsl.tools.opt import MdslOptMain

    def forever(self):
        while True:
            pass

    monkeypatch.setattr(MdslOptMain, "run", forever)
    outcome = run_case(simple_case(tmp_path), tmp_path / "case", timeout=0.2)
    assert outcome.status == "hang" and outcome.seconds < 2


def test_harness_reports_an_error_without_a_code(tmp_path, monkeypatch):
    from modeldsl.tools.opt import MdslOptMain

    def uncoded(self):
        print("x.module:1:1: error: something", file=sys.stderr)
        raise SystemExit(1)

    monkeypatch.setattr(MdslOptMain, "run", uncoded)
    outcome = run_case(simple_case(tmp_path), tmp_path / "case")
    assert outcome.status == "uncoded" and outcome.rc == 1
