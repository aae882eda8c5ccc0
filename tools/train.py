"""``mdsl-run MODEL.module --hf DIR --train DATA ...``: train a model on the CPU schedule executor.

``DATA`` (a text file or a ``.jsonl`` file with a ``"text"`` field per line)
is tokenized with the checkpoint's tokenizer (else as UTF-8 bytes) and packed
in order into sequences of ``--seq`` + 1 tokens (:mod:`modeldsl.runtime.data`); a ``.jsonl`` file of
prompt/completion or chat examples (:mod:`modeldsl.runtime.instructions`: chats rendered with the
checkpoint's chat template) gives one example per sequence, right-padded, the loss on its
completion or assistant tokens alone;
each of ``--steps`` optimizer steps runs ``--grad-accum`` micro-batches of
``--batch`` sequences through :class:`modeldsl.runtime.train.Trainer`
(AdamW, linear warmup then cosine decay over ``--steps``, clipping at
``--clip``; ``--dtype bf16``: mixed precision, 16-bit weights and
activations with fp32 master weights and moments). A tqdm bar shows the loss and tokens/s, every step prints a line
``step N loss L lr R tokens/s S epoch E`` (``L`` in full precision: Python's
``repr`` of the float), and the loss curve is drawn into a PNG at the end.

``--save OUT`` writes the trained weights as a HuggingFace checkpoint (each
tensor in the loaded checkpoint's dtype, the fp32 weights rounded to nearest
even; ``--save-dtype fp32|bf16`` chooses) and ``OUT/training_state.npz``
(optimizer moments, step, data position, random state, AdamW settings, the
losses so far and, where the tensors are narrower, the fp32 master weights;
no pickles), replacing OUT atomically (:mod:`modeldsl.runtime.atomic`). OUT
must be new, empty, a save of this run or the folder it resumes; anything
else is E044 unless ``--overwrite`` (:mod:`modeldsl.runtime.saves`). The loss
curve goes to a file named with ``--loss-plot`` (replaced atomically), else
into OUT, else to ``./loss.png``, which an existing file there makes E045
unless ``--overwrite``. ``--resume OUT`` continues
such a run bit for bit: weights, tokenizer and state come from OUT, the
settings too (flags given again must agree with them). ``--stop-after K``
stops (and saves) after step K of ``--steps``, as Ctrl-C does after the step
it interrupts.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path

from modeldsl.diagnostics import Diagnostic, DiagnosticError, render_all

STATE_FILE = "training_state.npz"  # training_run.STATE_FILE, not imported: mdsl-run --help loads no runtime
PLOT_FILE = "loss.png"
SAVE_DTYPES = ("fp32", "bf16")

# the run's settings: flag -> attribute (a resumed run takes those left out from its state)
SETTINGS = {
    "--steps": "steps", "--batch": "batch", "--seq": "seq", "--grad-accum": "grad_accum", "--lr": "lr",
    "--warmup": "warmup", "--weight-decay": "weight_decay", "--clip": "clip", "--min-lr-ratio": "min_lr_ratio",
    "--seed": "seed", "--dtype": "dtype", "--base-dtype": "base_dtype", "--packing": "packing", "--dp": "dp",
    "--zero": "zero", "--tp": "tp",
}
DEFAULTS = {"grad_accum": 1, "warmup": 0, "weight_decay": 0.01, "clip": 1.0, "min_lr_ratio": 0.0, "seed": 0,
            "dtype": "fp32", "base_dtype": None, "packing": "padded", "dp": 1, "zero": False, "tp": 1}
TRAIN_ONLY = ("steps", "batch", "seq", "lr", "grad_accum", "warmup", "weight_decay", "clip", "min_lr_ratio",
              "save", "resume", "stop_after", "loss_plot", "recompute", "save_dtype",
              "overwrite", "lora", "lora_targets", "lora_dropout", "rslora", "eval", "eval_every", "base_dtype",
              "packing", "dp", "zero", "tp")
LORA_FLAGS = ("lora_targets", "lora_dropout", "rslora")  # each needs --lora R
BASE_DTYPES = ("bf16", "fp8")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("training (--train DATA)")
    g.add_argument("--train", metavar="DATA", help="train on a text file, or a .jsonl file of {\"text\": ...}, "
                   "{\"prompt\": ..., \"completion\": ...} or {\"messages\": [...]} lines (the loss on the "
                   "completions or assistant messages alone)")
    g.add_argument("--steps", type=int, metavar="N", help="optimizer steps of the run (the cosine schedule's length)")
    g.add_argument("--batch", type=int, metavar="B", help="sequences per micro-batch")
    g.add_argument("--seq", type=int, metavar="T", help="tokens per sequence (at most max_position_embeddings)")
    g.add_argument("--lr", type=float, metavar="LR", help="peak learning rate")
    g.add_argument("--grad-accum", type=int, metavar="K", help="micro-batches per optimizer step (default 1)")
    g.add_argument("--warmup", type=int, metavar="W", help="linear warmup steps (default 0)")
    g.add_argument("--weight-decay", type=float, metavar="WD", help="AdamW weight decay (default 0.01)")
    g.add_argument("--clip", type=float, metavar="C", help="clip the global gradient norm at C (default 1.0; "
                   "0: no clipping)")
    g.add_argument("--min-lr-ratio", type=float, metavar="R", help="the cosine decays to R * LR (default 0)")
    g.add_argument("--save", metavar="OUT", help="write the trained checkpoint and training state to the folder "
                   "OUT (replaced atomically; a new or empty folder, or a save of this run)")
    g.add_argument("--save-dtype", choices=SAVE_DTYPES, help="the dtype of the saved tensors (default: each "
                   "tensor's dtype in the loaded checkpoint)")
    g.add_argument("--overwrite", action="store_true", default=None,
                   help="replace a --save folder that holds other files "
                   "(everything in it) and an existing ./loss.png")
    g.add_argument("--resume", metavar="OUT", help="continue the run saved in OUT (its weights, tokenizer, "
                   "optimizer state and settings; --hf may be left out)")
    g.add_argument("--stop-after", type=int, metavar="K", help="stop after step K of --steps (and save)")
    g.add_argument("--loss-plot", metavar="FILE.png", help="where to draw the loss curve (default OUT/loss.png "
                   "with --save, else ./loss.png)")
    g.add_argument("--packing", choices=("padded", "packed"), help="instruction examples one per sequence, "
                   "right-padded (the default), or packed: as many whole examples as fit, each attending only to "
                   "itself, with positions from 0")
    g.add_argument("--eval", metavar="DATA", help="evaluation data (as --train's): its loss over every target "
                   "token, every --eval-every steps")
    g.add_argument("--eval-every", type=int, metavar="N", help="evaluate every N steps (default: at the last step)")
    g.add_argument("--lora", metavar="R[:ALPHA]", help="train LoRA adapters of rank R (scaling ALPHA / R; ALPHA "
                   "defaults to R) instead of the whole model, which stays frozen; --save writes them as a PEFT "
                   "adapter (adapter_config.json, adapter_model.safetensors)")
    g.add_argument("--lora-targets", metavar="MODULES", help="the modules the adapters go on, comma-separated: "
                   "q,k,v,o,gate,up,down (q_proj, ...) or all-linear (default: q,v)")
    g.add_argument("--lora-dropout", type=float, metavar="P", help="dropout on the adapters' input (default 0)")
    g.add_argument("--base-dtype", choices=BASE_DTYPES, help="store the frozen base of a LoRA run narrower: "
                   "bf16, or fp8 (e4m3 with a scale per output channel), dequantized layer by layer")
    g.add_argument("--rslora", action="store_true", default=None, help="rank-stabilized LoRA: scaling ALPHA / sqrt(R)")
    g.add_argument("--dp", type=int, metavar="N", help="data parallelism over the N processes of an MPI launch "
                   "(mpiexec -n N mdsl-run ... --dp N): each trains on its rows of every batch, the gradients "
                   "summed over them; rank 0 prints and saves (default 1)")
    g.add_argument("--tp", type=int, metavar="N", help="tensor parallelism over N processes (mpiexec -n N*DP "
                   "mdsl-run ... --tp N): each holds 1/N of the attention heads and of the MLP (default 1)")
    g.add_argument("--zero", action="store_true", default=None, help="with --dp: ZeRO-1, the AdamW moments "
                   "shared out over the ranks by parameter (each updates its own and sends them to the others)")
    g.add_argument("--recompute", metavar="MODE", help="what the backward recomputes instead of saving "
                   "(mdsl-recompute): none, annotated (the model's own @memory/@checkpoint/save:/recompute:; the "
                   "default), full (every stacked block checkpointed), auto[:BYTES] (the cheapest recomputes until "
                   "the saved activations fit BYTES, e.g. auto:2GiB; auto alone: the free memory)")


def _flag_error(message: str, hint: str = "see mdsl-run --help") -> DiagnosticError:
    return DiagnosticError([Diagnostic("E029", f"mdsl-run: {message}", None, hint)])


def _file_error(message: str, hint: str) -> DiagnosticError:
    return DiagnosticError([Diagnostic("E028", message, None, hint)])


def _state_error(path: Path, reason: str) -> DiagnosticError:
    return DiagnosticError([Diagnostic("E034", f"the training state '{path}' is unreadable: {reason}", None,
                                       "resume from a folder written by mdsl-run --train ... --save OUT")])


def _given(args, name: str) -> bool:
    return getattr(args, name, None) is not None


def check_train_flags(args) -> None:
    """Every training flag check that needs no model; sets ``args.resumed`` (the state, or None)
    and fills the settings left out (from the resumed state or the defaults)."""
    args.resumed = None
    if args.train is None and args.eval is not None:
        check_evaluation_flags(args)
        return
    if args.train is None:
        given = [f"--{n.replace('_', '-')}" for n in TRAIN_ONLY if _given(args, n)]
        if given:
            raise _flag_error(f"{', '.join(given)} {'is a training flag' if len(given) == 1 else 'are training flags'}"
                              " and needs --train DATA", "give --train DATA to train, or leave the flag out")
        if args.hf is None:
            raise _flag_error("the following arguments are required: --hf")
        return
    conflicts = _generation_flags(args)
    if conflicts:
        raise _flag_error(f"{', '.join(conflicts)} {'does' if len(conflicts) == 1 else 'do'} not apply to --train "
                          "(training runs the schedule)", "leave out the generation flags when training")
    if args.hf is None and args.resume is None:
        raise _flag_error("--train needs --hf DIR (the checkpoint to train) or --resume OUT")
    _check_values(args)
    data = Path(args.train)
    if not data.exists():
        raise _file_error(f"no such training data file '{data}'", "give a text file or a .jsonl file with a "
                          "\"text\" field per line")
    if data.is_dir():
        raise _file_error(f"the training data '{data}' is a folder, not a file", "give a text file or a .jsonl file")
    if args.resume is not None:
        _check_resume(args)
    else:
        missing = [flag for flag in ("--steps", "--batch", "--seq", "--lr") if not _given(args, SETTINGS[flag])]
        if missing:
            raise _flag_error(f"--train needs {', '.join(missing)}", "e.g. --steps 100 --batch 4 --seq 128 --lr 3e-4")
        for name, value in DEFAULTS.items():
            if getattr(args, name) is None:
                setattr(args, name, value)
    if args.packing == "packed":
        from modeldsl.runtime.instructions import is_instruction_data

        if not is_instruction_data(args.train):
            raise _flag_error(f"--packing packed applies to instruction data (prompt/completion or chat examples); "
                              f"'{args.train}' is text, one stream already", "leave --packing out for text")
    if args.stop_after is not None and not args.stop_after <= args.steps:
        raise _flag_error(f"--stop-after {args.stop_after} is past --steps {args.steps}",
                          f"give --stop-after {args.steps} or less")
    args.overwrite = bool(args.overwrite)
    args.run = _run_id(args)
    if args.save is not None:
        _check_save(args)
    elif args.save_dtype is not None:
        raise _flag_error("--save-dtype needs --save OUT", "give --save OUT, or leave --save-dtype out")
    if args.loss_plot is None and args.save is None and os.path.lexists(PLOT_FILE) and not args.overwrite:
        raise DiagnosticError([Diagnostic("E045", f"the loss curve goes to ./{PLOT_FILE}, which exists and which "
                                          "this run did not write", None, f"give --loss-plot FILE.png (a file you "
                                          f"name is replaced), --overwrite to replace ./{PLOT_FILE}, or move it "
                                          "away")])
    if args.loss_plot is not None:
        target = Path(args.loss_plot)
        name = _plot_in_save(target, args.save)
        if name is not None:
            _check_plot_name(name, args.save)
            return  # drawn into the save folder, which the save creates
        if not target.parent.is_dir():
            raise _file_error(f"--loss-plot: the folder '{target.parent}' of '{target}' does not exist",
                              "create the folder first, or give another path")
        if target.is_dir():
            raise _flag_error(f"--loss-plot '{target}' is a folder", "give a file name such as loss.png")


def _generation_flags(args) -> list[str]:
    return [flag for flag, given in (
        ("--prompt", args.prompt is not None), ("--tokens", args.tokens is not None),
        ("--max-new-tokens", args.max_new_tokens != 0), ("--temperature", args.temperature != 0),
        ("--top-k", args.top_k is not None), ("--no-cache", args.no_cache), ("--logits", args.logits is not None),
        ("--engine graph", args.engine != "schedule")) if given]


def check_evaluation_flags(args) -> None:
    """``--eval DATA`` without ``--train``: the evaluation loss of the checkpoint (with ``--adapter``)
    on DATA, in micro-batches of ``--batch`` sequences of ``--seq`` tokens."""
    allowed = ("batch", "seq", "eval")
    given = [f"--{n.replace('_', '-')}" for n in TRAIN_ONLY if n not in allowed and _given(args, n)]
    if given:
        raise _flag_error(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to an evaluation "
                          "(--eval without --train)", "give --train DATA to train, or leave the flags out")
    conflicts = _generation_flags(args)
    if conflicts:
        raise _flag_error(f"{', '.join(conflicts)} {'does' if len(conflicts) == 1 else 'do'} not apply to --eval "
                          "(an evaluation runs the schedule)", "leave out the generation flags when evaluating")
    if args.hf is None:
        raise _flag_error("--eval needs --hf DIR (the checkpoint to evaluate)")
    missing = [flag for flag in ("--batch", "--seq") if not _given(args, SETTINGS[flag])]
    if missing:
        raise _flag_error(f"--eval needs {', '.join(missing)}", "e.g. --batch 4 --seq 128")
    _check_values(args)


def run_evaluation(args) -> int:
    """Print the evaluation loss of the checkpoint (and ``--adapter``) on ``--eval DATA``."""
    import modeldsl
    from modeldsl.diagnostics import DiagnosticSink
    from modeldsl.runtime.train import Trainer
    from modeldsl.runtime.training_run import TrainingData, eos_id, evaluation_loss
    from modeldsl.tokenizer import Tokenizer

    source = Path(args.hf)
    tokenizer = Tokenizer(source)
    data = TrainingData.read(args.eval, source, tokenizer, eos_id(source, tokenizer), args.seq,
                             lambda diagnostic: _warn(args, [diagnostic]))
    sink = DiagnosticSink()
    model = modeldsl.load(args.model, hf=source, dtype="fp32", top=args.top, progress=True, sink=sink,
                          device=args.device, force_architecture=args.force_architecture,
                          allow_unused_tensors=args.allow_unused_tensors,
                          adapter=Path(args.adapter) if args.adapter is not None else None)
    _warn(args, sink.diagnostics)
    limit = model.max_positions
    if limit is not None and args.seq > limit:
        raise _flag_error(f"--seq {args.seq} is more than the model's {limit} positions (max_position_embeddings)",
                          f"give --seq {limit} or less")
    data.check_vocabulary(model.config("vocab_size"))
    loss, targets = evaluation_loss(Trainer(model), data, args.batch, args.seq)
    print(f"eval loss {loss!r} on '{args.eval}' ({targets} target tokens, {data.describe()})")
    return 0


def _run_id(args) -> str:
    """The id this run marks its saves with: the resumed save's (a continued run is the same
    run), else a new one."""
    from modeldsl.runtime.saves import new_run, saved_run

    return (saved_run(args.resume) if args.resume is not None else None) or new_run()


def save_target(args):
    """Where ``--save`` writes and what it may replace (:class:`modeldsl.runtime.saves.SaveTarget`)."""
    from modeldsl.runtime.saves import SaveTarget

    return SaveTarget(Path(args.save), args.run, overwrite=args.overwrite,
                      continues=Path(args.resume) if args.resume is not None else None,
                      what=f"--save '{args.save}'", how="--overwrite")


def _check_save(args) -> None:
    """E028 for a --save path under a file; E044 for a folder that is not this run's to replace."""
    from modeldsl.runtime.saves import previous_save

    out = Path(args.save)
    ancestor = next(p for p in (out.absolute(), *out.absolute().parents) if p.exists())
    if ancestor != out.absolute() and not ancestor.is_dir():
        raise _file_error(f"--save '{out}': '{ancestor}' is a file, not a folder", "give a folder path")
    previous_save(save_target(args), writes=("model.safetensors", "config.json", STATE_FILE, PLOT_FILE))


def _plot_in_save(plot: Path, save: str | None) -> str | None:
    """The name of the loss curve in the save folder where it goes there (it is then swapped in
    with the save), else None."""
    from modeldsl.runtime.saves import resolved

    if save is None:
        return None
    return plot.name if Path(os.path.abspath(plot)).parent == resolved(save) else None


def _check_plot_name(name: str, save: str) -> None:
    """E029 for a loss curve in the save folder under the name of one of the save's own files."""
    from modeldsl.hf.checkpoint import COPIED_FILES
    from modeldsl.runtime.saves import MARKER

    if name in ("model.safetensors", STATE_FILE, MARKER, *COPIED_FILES):
        raise _flag_error(f"--loss-plot: '{name}' in --save '{save}' is a file of the save",
                          f"give another name, such as {PLOT_FILE}")


def _saved_run_problem(saved: dict, state) -> str | None:
    """What makes a resumed run's saved settings unusable (the rules of the flags, and AdamW's), or None."""
    for name, low in (("steps", 1), ("batch", 1), ("seq", 1), ("grad_accum", 1), ("warmup", 0), ("seed", 0),
                      ("dp", 1)):
        value = saved[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            return f"its run setting {name} = {value!r} is not an integer >= {low}"
    if not isinstance(saved["zero"], bool):
        return f"its run setting zero = {saved['zero']!r} is not true or false"
    if saved["dtype"] not in ("fp32", "bf16"):
        return f"its run setting dtype = {saved['dtype']!r} is not fp32 or bf16"
    if saved["packing"] not in ("padded", "packed"):
        return f"its run setting packing = {saved['packing']!r} is not padded or packed"
    if saved["base_dtype"] not in (None, *BASE_DTYPES):
        return f"its run setting base_dtype = {saved['base_dtype']!r} is not bf16 or fp8"
    config = state.config
    if not (config.lr > 0 and config.eps > 0 and 0 <= config.beta1 < 1 and 0 <= config.beta2 < 1
            and config.weight_decay >= 0 and config.clip_norm >= 0 and 0 <= config.min_lr_ratio <= 1
            and isinstance(config.total_steps, int) and config.total_steps >= 0):
        return f"its AdamW settings {config} are out of range (lr, eps > 0; betas in [0, 1); ...)"
    data = state.meta.get("data", {})
    if not isinstance(data, dict) or any(not isinstance(data.get(k, 0), int) or isinstance(data.get(k, 0), bool)
                                         or data.get(k, 0) < 0 for k in ("position", "epoch")):
        return f"its data position {data!r} is not a pair of non-negative integers"
    return None


def _check_values(args) -> None:
    problems = []

    def integer(name: str, low: int) -> None:
        value = getattr(args, name)
        if value is not None and value < low:
            flag = "--" + name.replace("_", "-")
            problems.append(f"{flag} must be {'at least 1' if low == 1 else 'non-negative'}, got {value}")

    def number(name: str, positive: bool = False, high: float | None = None) -> None:
        value = getattr(args, name)
        if value is None:
            return
        flag = "--" + name.replace("_", "-")
        bad = not math.isfinite(value) or value < 0 or (positive and value == 0) or (high is not None and value > high)
        if bad:
            want = "a finite number > 0" if positive else (f"a number in [0, {high:g}]" if high is not None
                                                           else "a finite number >= 0")
            problems.append(f"{flag} must be {want}, got {value}")

    for name in ("steps", "batch", "seq", "grad_accum", "stop_after", "eval_every", "dp", "tp"):
        integer(name, 1)
    for name in ("warmup", "seed"):
        integer(name, 0)
    number("lr", positive=True)
    number("weight_decay")
    number("clip")
    number("min_lr_ratio", high=1.0)
    number("lora_dropout", high=0.99)
    if args.lora is not None:
        problems += lora_problems(args)
    else:
        problems += [f"--{n.replace('_', '-')} needs --lora R" for n in LORA_FLAGS if _given(args, n)]
    if args.base_dtype is not None and args.lora is None and args.adapter is None and args.resume is None:
        problems.append("--base-dtype needs --lora R or --adapter DIR (only a frozen base is stored narrower)")
    if args.recompute is not None:
        problems += recompute_problems(args.recompute)
    if args.eval_every is not None and args.eval is None:
        problems.append("--eval-every needs --eval DATA")
    if problems:
        raise DiagnosticError([Diagnostic("E029", f"mdsl-run: {p}", None, "see mdsl-run --help") for p in problems])


def step_memory_line(program, recompute: str) -> str:
    """What the compiled training step holds: its activations arena (saved for the backward and
    transient) and its recompute share of the FLOPs, under ``--recompute``."""
    from modeldsl.memory_report import training_memory

    memory = training_memory(program)
    share = f", recompute {memory.flops.recompute_fraction:.1%} of its FLOPs" if memory.flops is not None else ""
    return (f"training step (--recompute {recompute}): activations {_mib(memory.saved + memory.transient)} "
            f"(saved {_mib(memory.saved)}, transient {_mib(memory.transient)}){share}")


def adapter_line(model, trainer) -> str:
    """The adapters' share of the parameters, and the gradient and optimizer state sized for them alone."""
    import numpy as np

    total = sum(int(np.prod(w.shape)) for w in model.weights.values())
    trainable = sum(int(np.prod(trainer.optimizer.params[n].shape)) for n in trainer.optimizer.grads)
    state = sum(trainer.optimizer.program.arenas.get(a, 0) for a in ("grads", "optimizer"))
    modules = sorted({str(p.attributes["adapter"].data["module"].data).rsplit(".", 1)[-1]
                      for p in model.model.params() if p.is_adapter})
    return (f"LoRA on {', '.join(modules)}: {trainable:,} trainable parameters of {total:,} "
            f"({trainable / total:.2%}); gradients and optimizer state {state / 2**10:,.1f} KiB")


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def recompute_problems(spelling: str) -> list[str]:
    """What is wrong with a --recompute MODE (nothing: [])."""
    from modeldsl.diagnostics import PassOptionError
    from modeldsl.passes.recompute import MODES, parse_budget

    mode, _, budget = spelling.partition(":")
    if mode not in MODES:
        return [f"--recompute {spelling}: the mode is none, annotated, full or auto[:BYTES]"]
    if budget and mode != "auto":
        return [f"--recompute {spelling}: only auto takes a budget (auto:2GiB)"]
    try:
        parse_budget(budget) if budget else None
    except PassOptionError:
        return [f"--recompute {spelling}: '{budget}' is no byte count (auto:268435456, auto:256MiB, auto:2GiB)"]
    return []


def lora_problems(args) -> list[str]:
    """What is wrong with ``--lora R[:ALPHA]`` (also sets ``args.lora_options``, the options it gives)."""
    rank, _, alpha = args.lora.partition(":")
    try:
        options = {"r": int(rank), **({"lora_alpha": float(alpha)} if alpha else {})}
    except ValueError:
        return [f"--lora {args.lora} is not R or R:ALPHA (a rank and a scaling numerator, e.g. 8:16)"]
    if args.lora_targets is not None:
        options["target_modules"] = [t.strip() for t in args.lora_targets.split(",") if t.strip()]
    options |= {"lora_dropout": args.lora_dropout or 0.0, "use_rslora": bool(args.rslora), "seed": args.seed or 0}
    from modeldsl.runtime.lora import LoraOptions

    try:
        args.lora_options = LoraOptions.of(options)
    except DiagnosticError as err:
        return ["--lora: " + err.diagnostics[0].message.removeprefix("lora: ")]
    return []


def _check_resume(args) -> None:
    from modeldsl.runtime.train import load_training_state

    folder = Path(args.resume)
    path = folder / STATE_FILE
    if not folder.is_dir():
        raise _file_error(f"--resume: no such folder '{folder}'", "give the folder a run wrote with --save OUT")
    if not path.is_file():
        raise _file_error(f"--resume: '{folder}' has no {STATE_FILE}",
                          "give the folder a run wrote with --save OUT (a plain checkpoint goes to --hf)")
    try:
        state = load_training_state(path)
    except ValueError as err:
        raise _state_error(path, str(err)) from None
    except OSError as err:
        raise _file_error(f"cannot read '{path}': {err.strerror or err}", "check the file's permissions") from None
    run = state.meta.get("run")
    if not isinstance(run, dict) or any(k not in run for k in ("steps", "batch", "seq", "grad_accum", "seed")):
        raise _state_error(path, "it holds no run settings (steps, batch, seq, grad_accum, seed)")
    saved = {"steps": run["steps"], "batch": run["batch"], "seq": run["seq"], "grad_accum": run["grad_accum"],
             "seed": run["seed"], "dtype": run.get("dtype", "fp32"), "base_dtype": run.get("base_dtype"),
             "packing": run.get("packing", "padded"), "dp": run.get("dp", 1), "zero": run.get("zero", False),
             "tp": run.get("tp", 1),
             "lr": state.config.lr,
             "warmup": state.config.warmup_steps,
             "weight_decay": state.config.weight_decay, "clip": state.config.clip_norm,
             "min_lr_ratio": state.config.min_lr_ratio}
    problem = _saved_run_problem(saved, state)
    if problem:
        raise _state_error(path, problem)
    for flag, name in SETTINGS.items():
        value = getattr(args, name)
        if value is None:
            setattr(args, name, saved[name])
        elif value != saved[name]:
            raise _flag_error(f"{flag} {value} differs from the resumed run's {saved[name]}",
                              f"leave {flag} out when resuming (the state holds it), or start a new run from the "
                              f"saved weights with --hf {folder}")
    if state.step >= args.steps:
        raise _flag_error(f"the run in '{folder}' has finished: it is at step {state.step} of --steps {args.steps}",
                          f"start a new run from its weights with --hf {folder}")
    if args.stop_after is not None and args.stop_after <= state.step:
        raise _flag_error(f"--stop-after {args.stop_after}: the resumed run is already at step {state.step}",
                          f"give --stop-after between {state.step + 1} and {args.steps}")
    args.resumed = state


# ---------------------------------------------------------------------------- the run
class _Interrupt:
    """The first Ctrl-C stops training after the current step (which then saves); a second one
    interrupts at once."""

    def __init__(self) -> None:
        self.requested = False
        self.previous = None

    def __enter__(self) -> "_Interrupt":
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def _warn(args, diagnostics: list[Diagnostic]) -> None:
    if diagnostics:
        sys.stderr.write(render_all(diagnostics, args.diagnostics_format) + "\n")


def plot_losses(losses: list[float], path: Path, title: str) -> str | None:
    """Draw the loss per step into a PNG: None, or why no curve was drawn (matplotlib missing or
    failing; a plot is never worth the run). OSError when the file cannot be written."""
    try:
        import matplotlib
    except ImportError:
        return "drawing it needs matplotlib (pip install matplotlib)"
    try:
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    except Exception as err:  # noqa: BLE001 - a broken matplotlib installation
        return f"matplotlib failed: {type(err).__name__}: {err}"
    try:
        import numpy as np

        steps = np.arange(1, len(losses) + 1)
        ax.plot(steps, losses, marker="o" if len(losses) <= 50 else None, markersize=3, linewidth=1.2)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("training loss (mean cross-entropy)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
        fig.tight_layout()
        fig.savefig(path, format="png")
    except OSError:
        raise
    except Exception as err:  # noqa: BLE001
        return f"matplotlib failed: {type(err).__name__}: {err}"
    finally:
        plt.close(fig)
    return None


def _save(args, run, meta: dict, title: str, gathered) -> str | None:
    """Write the checkpoint (or the LoRA adapter), the training state and (where it belongs to the
    save) the loss curve into the save folder, swapped in atomically: what drawing the curve gave
    (:func:`plot_losses`; "" where it is drawn elsewhere)."""
    from modeldsl.runtime.saves import saving_folder

    out = Path(args.save)
    plot = Path(args.loss_plot) if args.loss_plot is not None else out / PLOT_FILE
    name = _plot_in_save(plot, args.save)
    problem: str | None = ""
    existed = out.exists()
    try:
        with saving_folder(save_target(args)) as folder:
            run.write(folder, meta, gathered, args.save_dtype)
            if name is not None:
                problem = plot_losses(run.losses, folder / name, title)
    except OSError as err:
        raise _file_error(f"cannot write the checkpoint to '{out}': {err.strerror or err}",
                          "free disk space or give a folder you can write; "
                          + ("the previous checkpoint there is unchanged" if existed
                             else "nothing was written")) from None
    return problem


def _draw_outside(losses: list[float], plot: Path, title: str, replace: bool) -> str | None:
    """Draw the loss curve into ``plot`` atomically (``replace``: over an existing file; else one
    there is kept): None, or why it was not drawn (E028 when it cannot be written)."""
    from modeldsl.files import replacing_file

    class NotDrawn(Exception):
        pass

    try:
        with replacing_file(plot, replace=replace) as tmp:
            problem = plot_losses(losses, tmp, title)
            if problem is not None:
                raise NotDrawn(problem)
    except NotDrawn as skipped:
        return str(skipped)
    except FileExistsError:
        return f"'{plot}' appeared during the run; it is kept (give --loss-plot FILE.png or --overwrite)"
    except OSError as err:
        raise _file_error(f"cannot write the loss curve '{plot}': {err.strerror or err}",
                          "give --loss-plot a path in a folder you can write") from None
    return None


def _has_adapters(model) -> bool:
    return any(p.is_adapter for p in model.model.params())


def _base_and_adapter(args, state, source: Path) -> tuple[Path, Path | None]:
    """The checkpoint to load and the adapter folder on it: a resumed LoRA run's base (its state
    names it) with the run's adapter, else ``--hf`` with ``--adapter``."""
    base = (state.meta.get("run") or {}).get("base") if state is not None else None
    if base is not None:
        if not Path(base, "config.json").is_file():
            raise _file_error(f"--resume: the LoRA run in '{args.resume}' trained on the checkpoint '{base}', "
                              "which is gone", "put the base checkpoint back there")
        return Path(base), source
    return source, Path(args.adapter) if args.adapter is not None else None


def run_training(args) -> int:
    import modeldsl
    from modeldsl.diagnostics import DiagnosticSink
    from modeldsl.runtime.optim import AdamWConfig
    from modeldsl.runtime.training_run import TrainingData, TrainingRun, check_resumable, eos_id
    from modeldsl.tokenizer import Tokenizer

    state = args.resumed
    if state is not None:
        check_resumable(args.tp, args.resume)  # before the model loads
    source = Path(args.resume if state is not None else args.hf)
    tokenizer = Tokenizer(source)
    base, adapter = _base_and_adapter(args, state, source)
    eos = eos_id(source if (source / "config.json").is_file() else base, tokenizer)  # a LoRA save: its base's
    warn = lambda diagnostic: _warn(args, [diagnostic])  # noqa: E731
    # before the model loads: data problems are found at once
    data = TrainingData.read(args.train, source, tokenizer, eos, args.seq, warn)
    evaluation = TrainingData.read(args.eval, source, tokenizer, eos, args.seq, warn) if args.eval else None
    sink = DiagnosticSink()
    if args.tp > 1:
        from modeldsl.runtime import distributed

        distributed.start(distributed.Layout(tp=args.tp, dp=args.dp))
    model = modeldsl.load(args.model, hf=base, dtype="fp32", top=args.top, progress=True, sink=sink, tp=args.tp,
                          device=args.device, force_architecture=args.force_architecture,
                          allow_unused_tensors=args.allow_unused_tensors, adapter=adapter,
                          lora=getattr(args, "lora_options", None) if adapter is None else None,
                          base_dtype=args.base_dtype)
    _warn(args, sink.diagnostics)
    if state is not None:
        config = state.config
        data_state = state.meta.get("data", {})
        if data_state.get("sha256") != data.fingerprint:
            position = int(data_state.get("position", 0))
            _warn(args, [Diagnostic(
                "W009", f"{data.name} ({len(data.tokens)} tokens) is not what the run in "
                f"'{args.resume}' was reading ({data_state.get('tokens')} tokens from '{data_state.get('file')}'); "
                f"reading it from {'example' if data.instructions is not None else 'token'} {position}", None,
                "give the same --train DATA to continue the run exactly")])
        if not isinstance(state.meta.get("rng"), dict):
            raise _state_error(source / STATE_FILE, "its random state is not numpy's PCG64 state")
    else:
        config = AdamWConfig(lr=args.lr, weight_decay=args.weight_decay, warmup_steps=args.warmup,
                             total_steps=args.steps, min_lr_ratio=args.min_lr_ratio, clip_norm=args.clip)
    try:
        run = TrainingRun(model, data, args.steps, args.batch, args.seq, config, args.grad_accum, args.dtype,
                          args.recompute or "annotated", args.seed, eval_data=evaluation,
                          eval_every=(args.eval_every or args.steps) if evaluation is not None else 0, state=state,
                          warn=warn, packing=args.packing, dp=args.dp, zero=args.zero, tp=args.tp)
    except DiagnosticError as err:
        if err.diagnostics[0].code == "E029" and "positions" in err.diagnostics[0].message:
            raise _flag_error(err.diagnostics[0].message.replace("seq ", "--seq ", 1), f"give --seq "
                              f"{model.max_positions} or less") from None
        raise
    except (ValueError, TypeError, KeyError, OverflowError) as err:
        raise _state_error(source / STATE_FILE, f"{err} (saved from another model?)") from None
    if state is not None and len(run.losses) != state.step:
        raise _state_error(source / STATE_FILE, f"it holds {len(run.losses)} losses for {state.step} steps")

    if run.rank == 0:
        return _train_and_save(args, run, model, data, config, base)
    with contextlib.redirect_stdout(io.StringIO()):  # the other data-parallel ranks train beside rank 0, silent
        return _train_and_save(args, run, model, data, config, base, quiet=True)


def _train_and_save(args, run, model, data, config, base, quiet: bool = False) -> int:
    """The steps of a training run, their report and (rank 0) the save, the merge and the loss curve."""
    from tqdm import tqdm

    program = run.compile().program  # compiled, and checked against the memory (E038), before a batch is cut
    first = run.done
    last = args.stop_after if args.stop_after is not None else args.steps
    per_step = run.tokens_per_step
    print(f"training on {len(data.tokens)} tokens of '{args.train}' ({data.describe(args.packing)}): steps "
          f"{first + 1}..{last} of {args.steps}, "
          f"{args.grad_accum} x {args.batch} sequences of {args.seq} tokens per step"
          + (f", data-parallel over {args.dp} ranks ({args.batch // args.dp} sequences each)" if args.dp > 1 else "")
          + (f", tensor-parallel over {args.tp} ranks" if args.tp > 1 else "")
          + (", bf16 mixed precision" if args.dtype == "bf16" else "") + f", on {args.device}")
    print(step_memory_line(program, args.recompute or "annotated"))
    if _has_adapters(model):
        print(adapter_line(model, run.trainer))
    from modeldsl.memory_report import format_base, stored_base

    base_stored = stored_base(program)
    if base_stored is not None:
        print(format_base(base_stored))
    started = time.perf_counter()
    interrupted = False
    with _Interrupt() as interrupt, tqdm(total=args.steps, initial=first, unit="step", desc="training",
                                         dynamic_ncols=True, file=sys.stderr, disable=quiet) as bar:
        while run.done < last:
            info = run.step()
            bar.set_postfix(loss=f"{info.loss:.4f}", tok_s=f"{info.tokens_per_second:.0f}", epoch=info.epoch)
            bar.update(1)
            tqdm.write(f"step {info.step} loss {info.loss!r} lr {info.lr:.6g} tokens/s {info.tokens_per_second:.1f} "
                       f"epoch {info.epoch}", file=sys.stdout)
            if info.eval_loss is not None:
                tqdm.write(f"step {info.step} eval loss {info.eval_loss!r} on '{args.eval}'", file=sys.stdout)
            if interrupt.requested and run.done < last:
                interrupted = True
                break
    elapsed = time.perf_counter() - started
    done = run.done - first
    if done:
        print(f"trained {done} step{'s' if done != 1 else ''} in {elapsed:.2f} s ({done * per_step} tokens, "
              f"{done * per_step / elapsed:.1f} tokens/s); at step {run.done} of {args.steps}, epoch "
              f"{run.batches.epoch}, {data.where(run.batches)}")
    if interrupted:
        print(f"interrupted: stopped after step {run.done}")
    # what the other ranks hold of the save (ZeRO-1's moments, tensor-parallel shares): rank 0 writes it
    gathered = run.gathered() if args.save is not None else None
    if quiet:
        return 130 if interrupted else 0

    out = Path(args.save) if args.save is not None else None
    plot = Path(args.loss_plot) if args.loss_plot is not None else (out / PLOT_FILE if out else Path(PLOT_FILE))
    title = f"{Path(args.model).stem if args.model else model.model.sym_name.data} on {Path(args.train).name}: " \
            f"{args.grad_accum}x{args.batch}x{args.seq} tokens/step, lr {config.lr:g}"
    problem: str | None = ""  # "": not drawn yet; None: drawn; else why not
    if out is not None:
        meta = run.meta(str(Path(base).resolve()) if _has_adapters(model) else None)
        meta["run"]["model"] = str(args.model) if args.model else None
        meta["run"]["base_dtype"] = args.base_dtype
        problem = _save(args, run, meta, title, gathered)
        what = "LoRA adapter" if _has_adapters(model) else "checkpoint"
        print(f"saved the {what} and training state (step {run.done}) to {out}")
    if args.merge_lora is not None:
        run.trainer.sync_weights()
        model.save_hf(args.merge_lora, overwrite=args.overwrite)
        print(f"saved the weights with the adapters merged in to {args.merge_lora}")
    if problem == "":
        problem = _draw_outside(run.losses, plot, title, replace=args.loss_plot is not None or args.overwrite)
    if problem is None:
        print(f"wrote the loss curve to {plot}")
    else:
        _warn(args, [Diagnostic("W007", f"no loss curve: {problem}", None,
                                "the training itself is unaffected; plot the 'step N loss L' lines yourself")])
    return 130 if interrupted else 0
