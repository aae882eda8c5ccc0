"""``mdsl-opt``: parse modeldsl IR, run a pass pipeline, print the result.

An ``xDSLOptMain`` that loads the ``mdsl.graph`` and ``mdsl.sched`` dialects
eagerly, takes its passes from :mod:`modeldsl.passes.registry`, accepts
``-p`` and ``--pass-pipeline`` (same syntax; an MLIR-style
``builtin.module(...)`` wrapper is accepted too) and reports bad input as
``file:line:col: error: ...`` with the source line and a caret, never a
Python traceback. After the pipeline, ``--emit=memory-report`` prints the
memory plan of each ``mdsl.sched.program`` instead of the IR and
``--emit=memory-plot FILE.png`` draws it (:mod:`modeldsl.memory_report`).

``--verify-backward`` checks the model's backward against finite differences
in float64 (spec 9.8.1, :mod:`modeldsl.verify_backward`): its written backward
(``@backward``, from a ``backward:`` section) where it has one, else its
derived gradient (``mdsl-autodiff``; ``--verify-derived`` forces this one);
the report's header says which. The model is specialized with small sizes
(``--verify-shapes B=2,T=8``; a Module DSL parameter named there is a
lowering value instead, so ``d_model=32,n_layers=2`` makes a model tiny),
given random weights and inputs (seed 0), and each parameter's and float
input's directional derivative is printed as a table; the exit code is 1
when an error is above ``--verify-tolerance`` (default 1e-3).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import IO

from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import ArgSpecParseError, DiagnosticException, ParseError, VerifyException
from xdsl.xdsl_opt_main import xDSLOptMain

from modeldsl.diagnostics import Diagnostic, DiagnosticError, render_all
from modeldsl.ir import LocatedParseError, LocatingParser, load_dialects, verify_module
from modeldsl.passes.registry import PASSES
from modeldsl.symbolic import STAR


VERIFY_SHAPES = {"B": 2, "T": 8}
VERIFY_MAX_ELEMENTS = 2**25  # parameters and inputs: 256 MiB of float64


class UserError(Exception):
    """Bad input or flags: reported as a message, exit code 1."""


def normalize_pipeline(spec: str) -> str:
    """Strip an MLIR-style ``builtin.module(...)`` wrapper from a pipeline."""
    spec = spec.strip()
    for prefix in ("builtin.module(", "any("):
        if spec.startswith(prefix) and spec.endswith(")"):
            return spec[len(prefix) : -1].strip()
    return spec


def split_plot_file(args: Sequence[str]) -> list[str]:
    """``--emit=memory-plot FILE.png`` (or ``--emit memory-plot FILE.png``,
    ``--emit=memory-plot=FILE.png``) as ``--emit=memory-plot --plot-file FILE.png``."""
    out: list[str] = []
    k = 0
    while k < len(args):
        arg = args[k]
        if arg == "--emit" and k + 1 < len(args) and args[k + 1].startswith("memory-plot"):
            arg, k = f"--emit={args[k + 1]}", k + 1
        if arg.startswith("--emit=memory-plot"):
            rest = arg[len("--emit=memory-plot"):]
            out.append("--emit=memory-plot")
            if rest.startswith("="):
                out += ["--plot-file", rest[1:]]
            elif rest:
                out.append(arg)  # something else: let argparse report it
            elif (k + 1 < len(args) and not args[k + 1].startswith("-")
                  and not args[k + 1].endswith((".mlir", ".module"))):
                out += ["--plot-file", args[k + 1]]
                k += 1
        else:
            out.append(arg)
        k += 1
    return out


class MdslOptMain(xDSLOptMain):
    def __init__(self, args: Sequence[str] | None = None):
        self._op_spans = {}
        args = split_plot_file(sys.argv[1:] if args is None else args)
        self.verify_failed = False
        self.hf_config: dict = {}
        super().__init__(description="modeldsl IR optimizer driver", args=args)
        if self.args.emit == "memory-plot" and not self.args.plot_file:
            raise UserError("--emit=memory-plot needs the PNG file to write: --emit=memory-plot FILE.png")
        self.verify = verify_options(self.args)

    def register_all_dialects(self) -> None:
        load_dialects(self.ctx)

    def register_all_passes(self) -> None:
        for name, factory in PASSES.items():
            self.register_pass(name, factory)

    def register_all_arguments(self, arg_parser: argparse.ArgumentParser) -> None:
        super().register_all_arguments(arg_parser)
        arg_parser.add_argument(
            "--emit",
            choices=("ir", "ast", "memory-report", "memory-plot"),
            default="ir",
            help="for Module DSL input (.module): 'ast' prints the parsed AST; after the pipeline, "
            "'memory-report' prints each program's arena sizes, peak and largest buffers, and "
            "'memory-plot FILE.png' draws its buffers over the schedule steps (planned programs only)",
        )
        arg_parser.add_argument(
            "--plot-file",
            default=None,
            metavar="FILE.png",
            help="where --emit=memory-plot writes its PNG (also given as --emit=memory-plot FILE.png)",
        )
        arg_parser.add_argument(
            "--lock",
            action="store_true",
            help="for Module DSL input: write module.lock (the resolved imports) beside the file",
        )
        arg_parser.add_argument(
            "--top",
            default=None,
            help="for Module DSL input: the declaration to lower (default: the model, else the last declaration)",
        )
        arg_parser.add_argument(
            "--hf",
            default=None,
            metavar="DIR",
            help="for Module DSL input: lower with the configuration of this HuggingFace checkpoint's config.json",
        )
        arg_parser.add_argument(
            "--force-architecture",
            action="store_true",
            help="with --hf: accept a checkpoint whose architecture the model does not declare (E036 becomes W010)",
        )
        arg_parser.add_argument(
            "--diagnostics-format",
            choices=("text", "json"),
            default="text",
            help="how Module DSL diagnostics are printed",
        )
        arg_parser.add_argument(
            "--verify-backward",
            action="store_true",
            help="check the model's backward against float64 finite differences (random weights and inputs, "
            "seed 0) and print each tensor's relative error instead of the IR; exit 1 when one is above the "
            "tolerance. The backward checked is the written one (a backward: section, @backward) where the "
            "model has one, else the gradient mdsl-autodiff derives",
        )
        arg_parser.add_argument(
            "--verify-derived",
            action="store_true",
            help="for --verify-backward: check the derived gradient (mdsl-autodiff) even where the model has a "
            "written backward",
        )
        arg_parser.add_argument(
            "--verify-shapes",
            default=None,
            metavar="B=2,T=8",
            help="for --verify-backward: sizes of the symbols (default B=2,T=8; '*' dims are B, T) and of "
            "integer model parameters (a Module DSL model's parameters are lowered with them)",
        )
        arg_parser.add_argument(
            "--verify-tolerance",
            default=None,
            metavar="TOL",
            help="for --verify-backward: the largest relative error that passes (default 1e-3)",
        )
        arg_parser.add_argument(
            "--verify-epsilon",
            default=None,
            metavar="EPS",
            help="for --verify-backward: the finite-difference step (default 1e-6)",
        )
        arg_parser.add_argument(
            "--pass-pipeline",
            type=str,
            default=None,
            help="pass pipeline, same syntax as -p (e.g. 'dce,cse' or 'builtin.module(dce)')",
        )

    def setup_pipeline(self) -> None:
        if self.args.pass_pipeline is not None:
            if self.args.passes:
                raise UserError("give the pipeline with either -p or --pass-pipeline, not both")
            self.args.passes = self.args.pass_pipeline
        self.args.passes = normalize_pipeline(self.args.passes)
        try:
            super().setup_pipeline()
        except ArgSpecParseError as err:
            raise UserError(f"invalid pass pipeline: {err}") from None
        except ValueError as err:
            known = ", ".join(sorted(self.available_passes))
            raise UserError(f"{err} (known passes: {known})") from None

    def register_all_frontends(self) -> None:
        def parse_mlir(stream: IO[bytes]) -> ModuleOp:
            parser = LocatingParser(self.ctx, stream.read().decode(), self.get_input_name())
            try:
                module = parser.parse_module(not self.args.no_implicit_module)
            except ParseError as err:
                raise LocatedParseError(err.span, err.msg) from None
            self._op_spans = parser.op_spans
            return module

        self.available_frontends["mlir"] = parse_mlir

    def parse_chunk(self, chunk: IO[bytes], file_extension: str, start_offset: int = 0) -> ModuleOp | None:
        module = super().parse_chunk(chunk, file_extension, start_offset)
        if start_offset:
            self._op_spans = {
                op: dataclasses.replace(span, line_offset=start_offset)
                for op, span in self._op_spans.items()
            }
        return module

    def run(self) -> None:
        if self.args.input_file and self.args.input_file.endswith(".module"):
            self.run_module_dsl()
            return
        super().run()

    def run_module_dsl(self) -> None:
        """Parse, check and lower a Module DSL file and print the mdsl.graph IR
        (after the pipeline); ``--emit=ast`` prints its AST instead."""
        from modeldsl.frontend.text.ast import dump
        from modeldsl.frontend.text.parser import parse_source, read_source

        path = self.args.input_file
        program = parse_source(read_source(path), path)
        if self.args.emit == "ast":
            sys.stdout.write(dump(program))
            return
        if self.args.lock:
            self.write_lock(program, path)
        from modeldsl.diagnostics import DiagnosticSink
        from modeldsl.lower import lower_program

        sink = DiagnosticSink()
        config = self.checkpoint_config(program) if self.args.hf else None
        if self.verify is not None:
            config = self.verify_lowering_config(program, config)
        module = lower_program(program, self.args.top, config, sink=sink)
        if sink.diagnostics:
            sys.stderr.write(render_all(sink.diagnostics, self.args.diagnostics_format))
        self.apply_passes(module)
        sys.stdout.write(self.output_resulting_program(module))

    def checkpoint_config(self, program) -> dict:
        """The model's parameters from ``--hf DIR``'s config.json, through its hf_config."""
        from modeldsl.diagnostics import Diagnostic
        from modeldsl.dialects.graph import ModelOp
        from modeldsl.hf.config import dsl_config, read_config
        from modeldsl.hf.safetensors_io import CheckpointError
        from modeldsl.lower import choose_top, lower_program

        decl = choose_top(program, self.args.top)
        default = next(op for op in lower_program(program, decl.name).walk() if isinstance(op, ModelOp))
        try:
            self.hf_config = read_config(self.args.hf)
            return dsl_config(decl, default, self.hf_config, self.args.force_architecture,
                              warn=lambda w: sys.stderr.write(render_all([w], self.args.diagnostics_format)))
        except CheckpointError as err:
            raise DiagnosticError([Diagnostic(err.code, err.message, err.span, err.hint)]) from None

    def verify_lowering_config(self, program, config: dict | None) -> dict | None:
        """``--verify-shapes`` values that name parameters of the lowered declaration join its
        configuration (over the checkpoint's); the rest bind symbols after lowering."""
        from modeldsl.lower import choose_top

        decl = choose_top(program, self.args.top)
        params = {p.name: p for p in decl.params or [] if p.name is not None and not p.rest}
        names = set(params)
        for name in self.verify.given:
            kind = getattr(params[name].type, "id", None) if name in params else "int"
            if kind != "int":
                raise flag_error(f"--verify-shapes: {name} is a{'n' if str(kind)[:1] in 'aeiou' else ''} {kind} "
                                 f"parameter of {decl.name}, not a size",
                                 "--verify-shapes binds sizes; other values come from the model's defaults or "
                                 "a checkpoint's config (--hf DIR)")
        lowered = {k: v for k, v in self.verify.sizes.items() if k in names}
        self.verify.bindings = {k: v for k, v in self.verify.sizes.items() if k not in names}
        return {**(config or {}), **lowered} if lowered or config is not None else None

    def specialize_for_verify(self, prog: ModuleOp) -> None:
        """Bind ``--verify-shapes`` (and every config integer) into each model; E029 naming the
        symbols still unbound and the names that are neither symbols nor config values."""
        from modeldsl.dialects.graph import ModelOp
        from modeldsl.passes.specialize import _symbols_of, specialize_model
        from modeldsl.verify_backward import unbound_symbols

        models = [m for m in prog.walk() if isinstance(m, ModelOp)]
        if not models:
            raise flag_error("--verify-backward needs a model: the input has no mdsl.graph.model",
                             "lower a Module DSL model, module or block (--top NAME)")
        bindings = self.verify.bindings if self.verify.bindings is not None else self.verify.sizes
        for model in models:
            known = _symbols_of(model) | set(model.config_values)
            unknown = sorted(k for k in bindings if k not in known and k not in VERIFY_SHAPES)
            if unknown:
                raise flag_error(f"--verify-shapes: {', '.join(unknown)} is neither a symbol nor a config value of "
                                 f"@{model.sym_name.data}",
                                 "symbols: " + (", ".join(sorted(_symbols_of(model))) or "none") + "; config: "
                                 + (", ".join(model.config_values) or "none"))
            specialize_model(model, {k: v for k, v in bindings.items() if k in known})
            missing = unbound_symbols(model)
            if missing:
                example = ",".join(f"{k}={v}" for k, v in {**VERIFY_SHAPES, **bindings}.items())
                raise flag_error(f"--verify-backward: the shapes of @{model.sym_name.data} still hold "
                                 f"{', '.join(missing)}: the check needs concrete sizes",
                                 f"give them with --verify-shapes {example},{'=4,'.join(missing)}=4")

    def verify_backward_report(self, prog: ModuleOp) -> str:
        """The finite-difference table of each model's gradient (``--verify-backward``)."""
        from modeldsl.dialects.graph import ModelOp
        from modeldsl.passes.autodiff import AutodiffError
        from modeldsl.runtime.executor import ExecutionError
        from modeldsl.verify_backward import (
            BackwardCheckError,
            checked_backward,
            random_inputs,
            random_weights,
            report,
            verify_backward,
        )

        which = "derived" if self.verify.derived else "auto"
        out = []
        for model in [m for m in prog.walk() if isinstance(m, ModelOp)]:
            sizes = {**VERIFY_SHAPES, **self.verify.sizes}
            self.check_size(model, sizes)
            try:
                kind = checked_backward(model, which=which)
                inputs = random_inputs(model, sizes=sizes, rope=self.rope_of(model))
                checks = verify_backward(model, random_weights(model), inputs, epsilon=self.verify.epsilon,
                                         which=which)
            except BackwardCheckError as err:
                raise DiagnosticError([Diagnostic(err.code, f"--verify-backward: {err.message}", None,
                                                  err.hint)]) from None
            except AutodiffError as err:
                hint = ("drop --verify-derived to check the module's written backward" if self.verify.derived
                        and checked_backward(model) == "written" else "write a backward: section for this module")
                raise DiagnosticError([Diagnostic("E014", f"--verify-backward: {err}", None, hint)]) from None
            except ExecutionError as err:
                raise DiagnosticError([Diagnostic("E014", f"--verify-backward: {err}", None,
                                                  "the check runs the model with the numpy reference kernels")]) \
                    from None
            shapes = ", ".join(f"{k}={v}" for k, v in sizes.items())
            what = "the written backward @backward" if kind == "written" else "the derived gradient (mdsl-autodiff)"
            out.append(f"verify-backward @{model.sym_name.data} ({shapes}; float64, epsilon "
                       f"{self.verify.epsilon:g}, seed 0): {what}\n")
            text, ok = report(checks, self.verify.tolerance)
            out.append(text)
            self.verify_failed |= not ok
        return "".join(out)

    def check_size(self, model, sizes: dict[str, int]) -> None:
        """E029 for a model too large for a float64 finite-difference check."""
        from math import prod

        from modeldsl.dialects.graph import ParamOp
        from modeldsl.verify_backward import forward_of

        types_ = [p.param_type for p in model.body.block.ops if isinstance(p, ParamOp)]
        forward = forward_of(model)
        types_ += [a.type for a in forward.body.block.args] if forward is not None else []
        count = sum(prod(sizes["B"] * sizes["T"] if d is STAR else d.evaluate({}) for d in t.shape) for t in types_)
        if count > VERIFY_MAX_ELEMENTS:
            raise flag_error(f"--verify-backward: @{model.sym_name.data} has {count:,} parameter and input "
                             f"elements, more than the check runs ({VERIFY_MAX_ELEMENTS:,}); it is meant for small "
                             "sizes", "make the model small with --verify-shapes, e.g. d_model=32,n_layers=2")

    def rope_of(self, model):
        """The RoPE frequencies of the model's ``freqs`` input (rope_theta, the checkpoint's scaling)."""
        from xdsl.dialects.builtin import FloatAttr, IntegerAttr

        from modeldsl.runtime.rope import RopeScalingError, rope_frequencies
        from modeldsl.verify_backward import forward_of

        forward = forward_of(model)
        arg = next((a for a in forward.body.block.args if a.name_hint == "freqs"), None) if forward else None
        if arg is None or len(arg.type.shape) != 3 or not arg.type.shape[1].is_const():
            return None
        config = model.config_values
        theta = config.get("rope_theta")
        theta = theta.value.data if isinstance(theta, FloatAttr) else self.hf_config.get("rope_theta", 10000.0)
        max_seq = config.get("max_seq")
        max_seq = max_seq.value.data if isinstance(max_seq, IntegerAttr) else \
            self.hf_config.get("max_position_embeddings")
        try:
            return rope_frequencies(2 * arg.type.shape[1].evaluate({}), theta, self.hf_config.get("rope_scaling"),
                                    max_seq)
        except RopeScalingError as err:
            raise DiagnosticError([Diagnostic("E030", f"{self.args.hf}: rope_scaling {err}", None,
                                              "fix rope_scaling in config.json")]) from None

    def write_lock(self, program, path: str) -> None:
        """Write ``module.lock`` (spec 4.7.1) beside the input: every resolved import."""
        from pathlib import Path

        from modeldsl.diagnostics import DiagnosticSink
        from modeldsl.resolve.imports import resolve_program

        sink = DiagnosticSink()
        resolved = resolve_program(program, sink)
        sink.raise_if_errors()
        lock = Path(path).with_name("module.lock")
        lock.write_text(resolved.lock_manifest())
        print(f"mdsl-opt: wrote {lock}", file=sys.stderr)

    def output_resulting_program(self, prog: ModuleOp) -> str:
        """The IR, or with ``--emit=memory-report`` the memory report, or with
        ``--emit=memory-plot`` nothing (the plot goes to its file)."""
        if self.verify is not None:
            return self.verify_backward_report(prog)
        if self.args.emit not in ("memory-report", "memory-plot"):
            return super().output_resulting_program(prog)
        from modeldsl.memory_report import NotPlanned, memory_report, plot_memory

        try:
            if self.args.emit == "memory-report":
                return memory_report(prog)
            plot_memory(prog, self.args.plot_file)
        except NotPlanned as err:
            raise UserError(str(err)) from None
        print(f"mdsl-opt: wrote {self.args.plot_file}", file=sys.stderr)
        return ""

    def apply_passes(self, prog: ModuleOp) -> None:
        if not self.args.disable_verify:
            diagnostics = verify_module(prog, self._op_spans)
            if diagnostics:
                raise InputDiagnostics("".join(d.render() for d in diagnostics))
        if self.verify is not None:
            self.specialize_for_verify(prog)
        try:
            super().apply_passes(prog)
        except (VerifyException, DiagnosticException):
            diagnostics = verify_module(prog)
            if not diagnostics:
                raise
            steps = [f"--verify-shapes {self.verify.text()}"] if self.verify is not None else []
            steps += [self.args.passes] if self.args.passes else []
            where = f"after {' and '.join(steps)}: " if steps else ""
            raise DiagnosticError([
                Diagnostic("E004", f"{where}'{d.op_name}' op {d.message}", None,
                           "the bound values make shapes disagree; check them against the model's constraints")
                for d in diagnostics
            ]) from None


@dataclasses.dataclass
class VerifyOptions:
    """``--verify-backward``'s options: the sizes given (over B=2, T=8), the tolerance, the step and
    whether the derived gradient is checked even where a written backward is (``--verify-derived``);
    ``bindings`` the sizes left to bind after lowering (None: all of them)."""

    sizes: dict[str, int]
    tolerance: float
    epsilon: float
    derived: bool = False
    bindings: dict[str, int] | None = None

    def text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.sizes.items())

    @property
    def given(self) -> list[str]:
        return [k for k in self.sizes if k not in VERIFY_SHAPES]


def flag_error(message: str, hint: str = "") -> DiagnosticError:
    return DiagnosticError([Diagnostic("E029", message, None, hint)])


def verify_options(args: argparse.Namespace) -> VerifyOptions | None:
    """The checked ``--verify-*`` flags (E029 for a bad value or one without --verify-backward)."""
    given = [f for f, v in (("--verify-shapes", args.verify_shapes), ("--verify-tolerance", args.verify_tolerance),
                            ("--verify-epsilon", args.verify_epsilon),
                            ("--verify-derived", args.verify_derived or None)) if v is not None]
    if not args.verify_backward:
        if given:
            raise flag_error(f"{given[0]} is an option of --verify-backward", "add --verify-backward")
        return None
    if args.emit != "ir":
        raise flag_error(f"--verify-backward prints the gradient check, not --emit={args.emit}",
                         "drop one of --verify-backward and --emit")
    return VerifyOptions(parse_sizes(args.verify_shapes or ""),
                         positive_float("--verify-tolerance", args.verify_tolerance, 1e-3),
                         positive_float("--verify-epsilon", args.verify_epsilon, 1e-6), args.verify_derived)


def parse_sizes(text: str) -> dict[str, int]:
    """``B=2,T=8`` (commas or spaces) as sizes over the defaults B=2, T=8."""
    sizes = dict(VERIFY_SHAPES)
    for item in text.replace(",", " ").split():
        name, eq, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not name.isidentifier():
            raise flag_error(f"--verify-shapes: '{item}' is not NAME=SIZE", "write --verify-shapes B=2,T=8")
        try:
            size = int(value)
        except ValueError:
            raise flag_error(f"--verify-shapes: {name}={value} is not an integer",
                             "sizes are positive integers: --verify-shapes B=2,T=8") from None
        if not 0 < size < 2**63:
            raise flag_error(f"--verify-shapes: {name}={size} is not a positive size",
                             "sizes are positive integers: --verify-shapes B=2,T=8")
        sizes[name] = size
    return sizes


def positive_float(flag: str, text: str | None, default: float) -> float:
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise flag_error(f"{flag} {text!r} is not a number", f"e.g. {flag} {default:g}") from None
    if not (value > 0 and value != float("inf")):
        raise flag_error(f"{flag} must be a finite number above 0, got {text}", f"e.g. {flag} {default:g}")
    return value


class InputDiagnostics(DiagnosticException):
    """Verifier failures of the input, already rendered with locations."""


def main(argv: Sequence[str] | None = None) -> int:
    tool = None
    try:
        tool = MdslOptMain(args=argv)
        tool.run()
        if tool.verify_failed:
            return 1
    except DiagnosticError as err:
        fmt = tool.args.diagnostics_format if tool is not None else "text"
        stream = sys.stdout if fmt == "json" else sys.stderr
        stream.write(render_all(err.diagnostics, fmt))
        return 1
    except UserError as err:
        print(f"mdsl-opt: error: {err}", file=sys.stderr)
        return 1
    except FileNotFoundError as err:
        print(f"mdsl-opt: error: no such file: {err.filename}", file=sys.stderr)
        return 1
    except (ParseError, DiagnosticException) as err:
        sys.stderr.write(str(err))
        return 1
    except ValueError as err:  # e.g. an unknown file extension
        print(f"mdsl-opt: error: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # noqa: BLE001 - a bug, but still no traceback for users
        if os.environ.get("MDSL_DEBUG"):
            raise
        print(
            f"mdsl-opt: internal error: {type(err).__name__}: {err}\n"
            "hint: this is a bug in modeldsl; rerun with MDSL_DEBUG=1 for a traceback and report it",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["MdslOptMain", "main", "ModulePass"]
