"""``mdsl-opt``: parse modeldsl IR, run a pass pipeline, print the result.

An ``xDSLOptMain`` that loads the ``mdsl.graph`` and ``mdsl.sched`` dialects
eagerly, takes its passes from :mod:`modeldsl.passes.registry`, accepts
``-p`` and ``--pass-pipeline`` (same syntax; an MLIR-style
``builtin.module(...)`` wrapper is accepted too) and reports bad input as
``file:line:col: error: ...`` with the source line and a caret, never a
Python traceback. After the pipeline, ``--emit=memory-report`` prints the
memory plan of each ``mdsl.sched.program`` instead of the IR and
``--emit=memory-plot FILE.png`` draws it (:mod:`modeldsl.memory_report`).
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
        super().__init__(description="modeldsl IR optimizer driver", args=args)
        if self.args.emit == "memory-plot" and not self.args.plot_file:
            raise UserError("--emit=memory-plot needs the PNG file to write: --emit=memory-plot FILE.png")

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
            "--diagnostics-format",
            choices=("text", "json"),
            default="text",
            help="how Module DSL diagnostics are printed",
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
        from modeldsl.frontend.text.parser import parse_source

        path = self.args.input_file
        with open(path, encoding="utf-8") as f:
            program = parse_source(f.read(), path)
        if self.args.emit == "ast":
            sys.stdout.write(dump(program))
            return
        if self.args.lock:
            self.write_lock(program, path)
        from modeldsl.diagnostics import DiagnosticSink
        from modeldsl.lower import lower_program

        sink = DiagnosticSink()
        config = self.checkpoint_config(program) if self.args.hf else None
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
            return dsl_config(decl, default, read_config(self.args.hf))
        except CheckpointError as err:
            raise DiagnosticError([Diagnostic(err.code, err.message, None, err.hint)]) from None

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
        try:
            super().apply_passes(prog)
        except (VerifyException, DiagnosticException):
            diagnostics = verify_module(prog)
            if not diagnostics:
                raise
            raise DiagnosticError([
                Diagnostic("E004", f"after {self.args.passes}: '{d.op_name}' op {d.message}", None,
                           "the bound values make shapes disagree; check them against the model's constraints")
                for d in diagnostics
            ]) from None


class InputDiagnostics(DiagnosticException):
    """Verifier failures of the input, already rendered with locations."""


def main(argv: Sequence[str] | None = None) -> int:
    tool = None
    try:
        tool = MdslOptMain(args=argv)
        tool.run()
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
