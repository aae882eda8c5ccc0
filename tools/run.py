"""``mdsl-run MODEL.module --hf DIR`` (or ``MODEL.py``, a Python DSL model): load a DSL model
with a HuggingFace checkpoint and run it.

``--prompt TEXT`` (tokenized with the checkpoint's ``tokenizer.json`` when it
has one, else as UTF-8 bytes) or ``--tokens 1,2,3``; ``--max-new-tokens N``
(default 16) generates greedily or, with ``--temperature``/``--top-k``/``--seed``,
by sampling, using the KV cache (``--no-cache``: full recomputation per token);
``--logits FILE.npy`` writes the prompt's logits. The output is the prompt,
the continuation (each labelled; their token ids too where there is no
tokenizer or the prompt was given as ids), then the prefill and decode speeds
in tokens/s. ``--threads N`` sets the threads the CPU kernels split their
rows over (:mod:`modeldsl.runtime.threads`). The prompt and the new tokens together may hold at
most ``max_position_embeddings`` tokens: a longer prompt is E029, and
generation stops at the limit with a W008 warning. ``--train DATA`` trains the
model instead (:mod:`modeldsl.tools.train`: ``--steps``, ``--batch``, ``--seq``,
``--lr``, ``--save OUT``, ``--resume OUT``, ...). Every problem is a coded
diagnostic, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from modeldsl.diagnostics import Diagnostic, DiagnosticError, DiagnosticSink, render_all
from modeldsl.runtime.threads import ENV_VAR as THREADS_ENV_VAR
from modeldsl.runtime.threads import parse_thread_count, set_pool_size
from modeldsl.tokenizer import Tokenizer
from modeldsl.tools import train as training
from modeldsl.tools.version import modeldsl_version

DEFAULT_NEW_TOKENS = 16


class FlagError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's exit becomes a coded diagnostic
        raise DiagnosticError([Diagnostic("E029", f"mdsl-run: {message}", None, "see mdsl-run --help")])


class HelpFormatter(argparse.HelpFormatter):
    """``--help`` shows each flag's default where it has one (and its help does not say it already)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if default is not None and default is not False and default != argparse.SUPPRESS and "default" not in text:
            text += " (default: %(default)s)"
        return text


def build_parser() -> Parser:
    p = Parser(prog="mdsl-run", description="Run a Module DSL model on a HuggingFace checkpoint.",
               formatter_class=HelpFormatter)
    p.add_argument("--version", action="version", version=f"mdsl-run (modeldsl {modeldsl_version()})")
    p.add_argument("model", nargs="?", help="the model: a Module DSL .module file "
                   "(e.g. modeldsl/std/models/llama.module) or a Python DSL .py file; left out: "
                   "the std model that serves the checkpoint's architecture (config.json's architectures)")
    p.add_argument("--hf", metavar="DIR", help="checkpoint folder: config.json + *.safetensors (required, "
                   "except with --train ... --resume OUT)")
    p.add_argument("--top", help="the declaration to run (default: the file's model)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--prompt", metavar="TEXT", help="text to tokenize")
    source.add_argument("--tokens", metavar="IDS", help="comma-separated token ids, e.g. 1,2,3")
    p.add_argument("--max-new-tokens", type=int, default=None, metavar="N",
                   help=f"tokens to generate after the prompt (0: only run the prompt) (default: {DEFAULT_NEW_TOKENS})")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help="sampling temperature; 0 is greedy decoding")
    p.add_argument("--top-k", type=int, default=None, metavar="K", help="sample from the K most likely tokens "
                   "(default: no limit; needs --temperature > 0)")
    p.add_argument("--seed", type=int, default=None, metavar="S",
                   help="random seed of the sampling (default: fresh each run; "
                   "needs --temperature > 0)")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole sequence for each token")
    p.add_argument("--logits", metavar="FILE.npy", help="write the prompt's logits [T, vocab] (fp32)")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default=None,
                   help="weights and activations (default fp32); with --train, bf16 is mixed precision: "
                        "16-bit weights and activations, fp32 master weights, moments and loss")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the schedule runs: the CPU (numpy kernels) or the GPU (CUDA kernels, cuBLASLt, cuDNN)")
    p.add_argument("--engine", choices=("schedule", "graph"), default="schedule",
                   help="the planned mdsl.sched schedule (default) or the graph interpreter (the oracle)")
    p.add_argument("--force-architecture", action="store_true",
                   help="load a checkpoint whose architecture the model does not declare (E036 becomes W010; the "
                        "config fields that change the math are still checked)")
    p.add_argument("--allow-unused-tensors", action="store_true",
                   help="load a checkpoint with tensors no hf_mapping rule reads (E040 becomes W006)")
    p.add_argument("--adapter", metavar="DIR", help="a PEFT LoRA adapter folder (adapter_config.json, "
                   "adapter_model.safetensors) on the checkpoint: to generate with, or to train on with --train")
    p.add_argument("--merge-lora", metavar="OUT", help="write the checkpoint with the adapters (--adapter, or "
                   "those --train --lora trained) merged into its weights, as an ordinary checkpoint")
    p.add_argument("--threads", metavar="N", help=f"threads the CPU kernels split their rows over (BLAS runs on one "
                   f"inside each; default: ${THREADS_ENV_VAR}, else the cores this process may use)")
    p.add_argument("--diagnostics-format", choices=("text", "json"), default="text",
                   help="how errors and warnings are printed")
    training.add_arguments(p)
    return p


def prompt_ids(args, tokenizer: Tokenizer) -> list[int]:
    """The prompt's token ids; the model checks them against its vocabulary and positions."""
    if args.tokens is not None:
        try:
            ids = [int(t) for t in args.tokens.split(",") if t.strip()]
        except ValueError:
            raise FlagError(f"--tokens takes comma-separated integers, got '{args.tokens}'") from None
    else:
        prompt = args.prompt if args.prompt is not None else ""
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as err:  # argv bytes that are not UTF-8 arrive as lone surrogates
            raise FlagError(f"--prompt is not UTF-8 text (at character {err.start + 1})") from None
        ids = tokenizer.encode(prompt)
    if not ids:
        raise FlagError("the prompt is empty: give --prompt TEXT or --tokens 1,2,3")
    return ids


def logits_path(flag: str) -> Path:
    """Where ``--logits`` writes: numpy's ``np.save`` adds ``.npy`` to a name without it."""
    return Path(flag if flag.endswith(".npy") else flag + ".npy")


def _save_logits(target: Path, logits) -> None:
    """``np.save`` into ``target`` atomically: the file is replaced in one step, nothing else is touched."""
    import numpy as np

    from modeldsl.files import replacing_file

    with replacing_file(target) as tmp, open(tmp, "wb") as f:
        np.save(f, logits)


def check_flags(args) -> list[Diagnostic]:
    """Every flag check, before anything loads: errors raise, warnings are returned."""
    from modeldsl.runtime.model import sampling_problems

    if args.max_new_tokens is None:  # not given: 0 where it does not apply (training)
        args.max_new_tokens = DEFAULT_NEW_TOKENS if args.train is None and args.eval is None else 0
    training.check_train_flags(args)
    problems = sampling_problems(args.max_new_tokens, args.temperature, args.top_k, args.seed)
    if problems:
        raise DiagnosticError([Diagnostic("E029", f"mdsl-run: --{name.replace('_', '-')} {problem}", None,
                                          "see mdsl-run --help") for name, problem in problems])
    if args.model is not None and not Path(args.model).is_file():
        raise DiagnosticError([Diagnostic("E028", f"no such model file '{args.model}'", None,
                                          "give the path of a .module or .py model file")])
    check_checkpoint_flag(args)
    check_adapter_flags(args)
    if args.threads is not None:
        args.threads = parse_thread_count(args.threads, "mdsl-run: --threads")
    if args.logits:
        target = logits_path(args.logits)
        if not target.parent.is_dir():
            raise DiagnosticError([Diagnostic("E028", f"--logits: the folder '{target.parent}' of '{target}' does "
                                              "not exist", None, "create the folder first, or give another path")])
        if target.is_dir():
            raise DiagnosticError([Diagnostic("E029", f"mdsl-run: --logits '{target}' is a folder", None,
                                              "give a file name such as logits.npy")])
    if args.engine == "graph" and args.device != "cpu":
        raise DiagnosticError([Diagnostic("E029", f"mdsl-run: --engine graph runs on the CPU, not --device "
                                          f"{args.device}", None, "leave out --engine graph to run the schedule on "
                                          "the GPU, or --device to interpret the graph on the CPU")])
    warnings = []
    if args.train is None and args.temperature == 0 and (args.seed is not None or args.top_k is not None):
        given = " and ".join(f for f, v in (("--top-k", args.top_k), ("--seed", args.seed)) if v is not None)
        warnings.append(Diagnostic("W007", f"{given} {'has' if ' and ' not in given else 'have'} no effect with "
                                   "greedy decoding (--temperature 0, the default)", None,
                                   "give --temperature T > 0 to sample, or leave the flag out"))
    return warnings


def check_adapter_flags(args) -> None:
    """``--adapter`` names a folder; ``--merge-lora`` has adapters to merge; not both kinds of adapters."""
    trains_lora = args.train is not None and args.lora is not None
    if args.adapter is not None and trains_lora:
        raise DiagnosticError([Diagnostic("E029", "mdsl-run: --adapter DIR and --lora R both give adapters", None,
                                          "train new adapters with --lora R, or go on training those of DIR "
                                          "with --adapter DIR")])
    if args.adapter is not None and not Path(args.adapter).is_dir():
        raise DiagnosticError([Diagnostic("E028", f"--adapter: no such folder '{args.adapter}'", None,
                                          "give the folder that holds adapter_config.json and "
                                          "adapter_model.safetensors")])
    if args.merge_lora is not None and args.adapter is None and not trains_lora:
        raise DiagnosticError([Diagnostic("E029", "mdsl-run: --merge-lora OUT has no adapters to merge", None,
                                          "give --adapter DIR, or train adapters with --train DATA --lora R")])


def check_checkpoint_flag(args) -> None:
    """``--hf`` names a folder (whether it is needed at all is checked with the training flags)."""
    if args.hf is not None and Path(args.hf).is_file():
        raise DiagnosticError([Diagnostic("E028", f"--hf '{args.hf}' is a file, expected a checkpoint folder", None,
                                          "give the folder that holds config.json and the *.safetensors files"
                                          + (f" (here: '{Path(args.hf).parent}')"
                                             if Path(args.hf).name == "config.json" else ""))])


def continuation_text(tokenizer: Tokenizer, prompt: list[int], generated: list[int]) -> str:
    """The text the new tokens add to the prompt's (decoded together, so a character split
    across the boundary is whole)."""
    before, after = tokenizer.decode(prompt), tokenizer.decode(prompt + generated)
    return after[len(before):] if after.startswith(before) else tokenizer.decode(generated)


def print_generation(args, tokenizer: Tokenizer, prompt: list[int], generated: list[int]) -> None:
    """The prompt and the continuation, each labelled (token ids too where text alone does not show them)."""
    noun = "token" if len(generated) == 1 else "tokens"
    print(f"prompt ({len(prompt)} tokens): {tokenizer.decode(prompt)!r}")
    print(f"continuation ({len(generated)} new {noun}): {continuation_text(tokenizer, prompt, generated)!r}")
    if tokenizer.inner is None or args.tokens is not None:
        print("prompt tokens:", ",".join(map(str, prompt)))
        print("new tokens:", ",".join(map(str, generated)))


def run(args) -> int:
    import modeldsl

    warnings = check_flags(args)
    set_pool_size(args.threads)
    if warnings:
        sys.stderr.write(render_all(warnings, args.diagnostics_format) + "\n")
    if args.train is not None:
        return training.run_training(args)
    if args.eval is not None:
        return training.run_evaluation(args)
    tokenizer = Tokenizer(Path(args.hf))
    sink = DiagnosticSink()
    model = modeldsl.load(args.model, hf=args.hf, dtype=args.dtype or "fp32", top=args.top, progress=True, sink=sink,
                          device=args.device, force_architecture=args.force_architecture,
                          allow_unused_tensors=args.allow_unused_tensors, adapter=args.adapter)
    if sink.diagnostics:
        sys.stderr.write(render_all(sink.diagnostics, args.diagnostics_format) + "\n")
    if args.merge_lora is not None:
        model.save_hf(args.merge_lora)
        print(f"saved the weights with the adapters of '{args.adapter}' merged in to {args.merge_lora}")
        if args.prompt is None and args.tokens is None:
            return 0
    ids = prompt_ids(args, tokenizer)
    limit = model.max_positions
    if limit is not None and len(ids) > limit:
        raise DiagnosticError([Diagnostic("E029", f"mdsl-run: the prompt has {len(ids)} tokens, more than the "
                                          f"model's {limit} positions (max_position_embeddings)", None,
                                          f"shorten the prompt to at most {limit} tokens")])
    new_tokens = args.max_new_tokens
    if limit is not None and len(ids) + new_tokens > limit:
        new_tokens = limit - len(ids)
        sys.stderr.write(render_all([Diagnostic(
            "W008", f"the prompt ({len(ids)} tokens) and --max-new-tokens {args.max_new_tokens} exceed the model's "
            f"{limit} positions (max_position_embeddings); generating {new_tokens} tokens", None,
            f"give --max-new-tokens {new_tokens} or less, or a shorter prompt")], args.diagnostics_format) + "\n")
    if args.logits:
        logits = model.forward(ids, engine=args.engine)
        target = logits_path(args.logits)
        try:
            _save_logits(target, logits)
        except OSError as err:
            raise DiagnosticError([Diagnostic("E028", f"cannot write --logits '{target}': {err.strerror or err}",
                                              None, "give a path in a folder you can write")]) from None
        print(f"wrote the prompt's logits {logits.shape} to {target}")
    timings: dict[str, float] = {}
    generated = model.generate(ids, new_tokens, args.temperature, args.top_k, args.seed,
                               use_cache=not args.no_cache, timings=timings, engine=args.engine)
    prefill, decode = timings["prefill"], timings["decode"]
    print_generation(args, tokenizer, ids, generated)
    print(f"prefill: {len(ids)} tokens in {prefill * 1000:.1f} ms ({len(ids) / prefill:.1f} tokens/s)")
    steps = max(len(generated) - 1, 0)  # the first new token comes from the prefill's logits
    if steps:
        mode = "KV cache" if not args.no_cache else "full recomputation"
        print(f"decode: {steps} step{'s' if steps != 1 else ''} in {decode * 1000:.1f} ms "
              f"({steps / decode:.1f} tokens/s, {mode})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    fmt = "text"
    try:
        args = build_parser().parse_args(argv)
        fmt = args.diagnostics_format
        from modeldsl.primitive_modules import load_from_environment

        load_from_environment()  # MDSL_PRIMITIVES: modules registering user primitives
        return run(args)
    except DiagnosticError as err:
        sys.stderr.write(render_all(err.diagnostics, fmt) + "\n")
        return end_other_ranks(1)
    except FlagError as err:
        sys.stderr.write(render_all([Diagnostic("E029", f"mdsl-run: {err}", None, "see mdsl-run --help")], fmt) + "\n")
        return end_other_ranks(1)
    except Exception as err:  # noqa: BLE001 - a bug, but still no traceback for users
        if os.environ.get("MDSL_DEBUG"):
            raise
        print(f"mdsl-run: internal error: {type(err).__name__}: {err}\n"
              "hint: this is a bug in modeldsl; rerun with MDSL_DEBUG=1 for a traceback and report it", file=sys.stderr)
        return end_other_ranks(2)
    finally:
        set_pool_size(None)  # --threads holds for this run only


def end_other_ranks(code: int) -> int:
    """``code``, after ending the job's other ranks where this is one of several MPI processes (they
    would wait for it at their next collective)."""
    if "modeldsl.runtime.distributed" in sys.modules:
        from modeldsl.runtime import distributed

        sys.stderr.flush()
        distributed.abort(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
