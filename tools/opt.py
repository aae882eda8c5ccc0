"""``mdsl-opt``: parse modeldsl IR or a Module DSL file, run a pass pipeline, print the result.

An ``xDSLOptMain`` that loads the ``mdsl.graph`` and ``mdsl.sched`` dialects
eagerly, takes its passes from :mod:`modeldsl.passes.registry` and behaves as
mlir-opt users expect:

- input: a ``.mlir`` or ``.module`` file, or ``-`` (stdin; ``-f module`` for
  Module DSL text); ``-o FILE`` writes the output there for every input kind;
- ``-p`` / ``--pass-pipeline`` (same syntax; an MLIR-style
  ``builtin.module(...)`` wrapper is accepted), ``--list-passes`` (also in
  ``--help``), "did you mean" for unknown passes and options;
- ``--print-ir-before=PASS``, ``--print-ir-after=PASS``,
  ``--print-ir-after-all``, ``--print-ir-after-change`` (to stderr, under
  mlir-opt's ``// -----// IR Dump After ...`` headers), ``--mlir-timing``
  (``--time-passes``): the wall time of parsing, each pass, verification and
  output in milliseconds;
- ``--verify-diagnostics`` matches ``expected-error {{...}}`` annotations
  (:mod:`modeldsl.tools.verify_diagnostics`);
- IR lowered from a ``.module`` carries its DSL locations
  (``--print-debuginfo`` prints them; verifier errors point at the DSL line);
- ``--lock`` / ``--locked`` write and check ``NAME.module.lock``;
- every error, whatever its source (flags, pipeline text, IR syntax, the
  verifier, the Module DSL), is one ``file:line:col: error[EXXX]: message``
  diagnostic with the source line, a caret and a hint; never a traceback.

After the pipeline, ``--emit=memory-report`` prints the memory plan of each
``mdsl.sched.program`` instead of the IR and ``--emit=memory-plot FILE.png``
draws it (:mod:`modeldsl.memory_report`); ``--emit=cost-report`` prints each
program's roofline cost estimate (:mod:`modeldsl.cost`; the device's peaks
from ``--cost-bandwidth`` and ``--cost-flops``); ``--emit=recompute-report``
prints the automatic ``mdsl-recompute``'s table (the pass hands it over; the
tool gives ``budget=auto`` the device's free memory); ``--emit=comm-report`` prints the bytes
each rank sends in each program's collectives (:mod:`modeldsl.comm_report`); ``--verify-backward`` checks the
model's backward against finite differences
(:mod:`modeldsl.tools.opt_verify_backward`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO

from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Attribute
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import DiagnosticException, ParseError, VerifyException
from xdsl.xdsl_opt_main import xDSLOptMain

from modeldsl.diagnostics import Diagnostic, DiagnosticError, Source, render_all
from modeldsl.files import read_regular_file
from modeldsl.ir import (
    LocatedParseError,
    LocatingParser,
    load_dialects,
    print_ir,
    remember_source,
    source_span,
    verify_module,
)
from modeldsl.passes.registry import PASSES
from modeldsl.primitive_modules import load_from_environment
from modeldsl.tools.opt_pipeline import (
    PipelineObserver,
    build_pipeline,
    normalize_pipeline,
    pass_list,
    pass_names_flag,
    suggestion,
    timing_report,
)
from modeldsl.tools.opt_verify_backward import VerifyBackwardMixin, flag_error, positive_float, verify_options
from modeldsl.tools.version import modeldsl_version

# What each input kind but IR is, for the --split-input-file error.
SPLIT_KINDS = {"module": "Module DSL text (.module)", "py": "a Python DSL file (.py)", "json": "JSON IR (.json)"}


class UserError(Exception):
    """Bad input or flags that have no better code: reported as E029, exit code 1."""


class FlagParser(argparse.ArgumentParser):
    """argparse whose errors are E029 diagnostics with a "did you mean" hint."""

    def error(self, message: str):
        hint = "mdsl-opt --help lists the options"
        if message.startswith("unrecognized arguments:"):
            unknown = message.split(":", 1)[1].split()[0].split("=")[0]
            hint = suggestion(unknown, list(self._option_string_actions), hint)
        raise flag_error(message, hint)


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


@dataclass
class InputText:
    """The input: its name in diagnostics, its text and its kind (``mlir`` or ``module``)."""

    name: str
    text: str
    kind: str
    path: str | None = None  # None for stdin


@dataclass
class ChunkResult:
    """What one chunk of the input produced: its output text and its diagnostics."""

    output: str = ""
    diagnostics: list[Diagnostic] = field(default_factory=list)


class MdslOptMain(VerifyBackwardMixin, xDSLOptMain):
    version_format = f"mdsl-opt (modeldsl {modeldsl_version()}) on xDSL {{xdsl_version}}"

    def __init__(self, args: Sequence[str] | None = None):
        self._op_spans = {}
        args = split_plot_file(sys.argv[1:] if args is None else args)
        self.verify_failed = False
        self.hf_config: dict = {}
        self.passes: list[ModulePass] = []
        self.recompute_tables: list[str] = []  # --emit=recompute-report: mdsl-recompute's automatic choices
        self.observer: PipelineObserver | None = None
        self.lowering_warnings: list[Diagnostic] = []
        super().__init__(description="modeldsl IR optimizer driver", args=args)
        load_dialects(self.ctx)  # once the flags are parsed: --help and --version need no dialect
        if self.args.emit == "memory-plot" and not self.args.plot_file:
            raise UserError("--emit=memory-plot needs the PNG file to write: --emit=memory-plot FILE.png")
        self.verify = verify_options(self.args)
        self.roofline = cost_roofline(self.args)

    # ------------------------------------------------------------------ registration

    def register_all_dialects(self) -> None:
        """Nothing before the flags are parsed: :meth:`__init__` loads the dialects after."""

    def register_all_passes(self) -> None:
        for name, factory in PASSES.items():
            self.register_pass(name, factory)

    def register_all_targets(self) -> None:
        """Only ``mlir``: xDSL's other targets (asm, llvm, csl, wasm, wgsl, mps) print
        nothing or fail on modeldsl's dialects."""
        from xdsl.targets import get_all_targets

        self.available_targets["mlir"] = get_all_targets()["mlir"]

    def register_all_frontends(self) -> None:
        self.available_frontends["mlir"] = self.parse_mlir_stream
        self.available_frontends["module"] = self.lower_module_stream
        self.available_frontends["json"] = self.parse_json_stream
        self.available_frontends["py"] = self.lower_python_stream

    def register_all_arguments(self, arg_parser: argparse.ArgumentParser) -> None:
        arg_parser.__class__ = FlagParser
        arg_parser.allow_abbrev = False  # as mlir-opt: --print-ir-after is not --print-ir-after-all
        arg_parser.formatter_class = argparse.RawDescriptionHelpFormatter
        arg_parser.epilog = pass_list(self.available_passes)
        super().register_all_arguments(arg_parser)
        for action in arg_parser._actions:  # noqa: SLF001 - clearer help for xDSL's own options
            if action.dest == "input_file":
                action.help = ("the .mlir, .module, .py (Python DSL) or .json file to read; '-' or none reads stdin "
                               "(-f module for Module DSL, -f py, -f json)")
            elif action.dest == "frontend":
                action.help = ("the kind of the input: mlir (IR), module (Module DSL), py (Python DSL) or json "
                               "(JSON IR); default: by file extension")
            elif action.dest == "passes":
                action.help = "the pass pipeline, e.g. 'cse,mdsl-plan-memory{alignment=64}' (see --list-passes)"
            elif action.dest == "target":
                action.help = "the output form: mlir (the only target that works on modeldsl's IR)"
            elif action.dest == "output_file":
                action.help = "write the output to this file instead of stdout"
            elif action.dest == "time_passes":
                add_alias(arg_parser, action, "--mlir-timing")
                action.help = "print the wall time of parsing, each pass, verification and output (ms) to stderr"
            elif action.dest == "print_debuginfo":
                add_alias(arg_parser, action, "--mlir-print-debuginfo")
                action.help = "print source locations: loc(\"file\":line:col) (Module DSL input carries its own)"
            elif action.dest == "print_op_generic":
                add_alias(arg_parser, action, "--mlir-print-op-generic")
            elif action.dest == "verify_diagnostics":
                action.help = ("check the diagnostics against the input's expected-error/-warning/-note {{...}} "
                               "annotations (@+N, @-N offsets); exit 1 on any mismatch")
        self.register_pipeline_arguments(arg_parser)
        self.register_module_arguments(arg_parser)
        self.register_verify_backward_arguments(arg_parser)

    def register_pipeline_arguments(self, arg_parser: argparse.ArgumentParser) -> None:
        arg_parser.add_argument("--pass-pipeline", type=str, default=None,
                                help="pass pipeline, same syntax as -p (e.g. 'dce,cse' or 'builtin.module(dce)')")
        arg_parser.add_argument("--print-diagnostics", action="store_true",
                                help="print each chunk's diagnostics to stdout and exit 0 (what xDSL's "
                                "--verify-diagnostics does; FileCheck tests of error messages use it)")
        arg_parser.add_argument("--list-passes", action="store_true",
                                help="list the passes with their options, defaults and a description, and exit")
        arg_parser.add_argument("--print-ir-before", metavar="PASS[,PASS]", default=None,
                                help="print the IR to stderr before each run of these passes")
        arg_parser.add_argument("--print-ir-after", metavar="PASS[,PASS]", default=None,
                                help="print the IR to stderr after each run of these passes")
        arg_parser.add_argument("--print-ir-before-all", action="store_true",
                                help="print the IR to stderr before every pass")
        arg_parser.add_argument("--print-ir-after-all", action="store_true",
                                help="print the IR to stderr after every pass")
        arg_parser.add_argument("--print-ir-after-change", action="store_true",
                                help="print the IR to stderr after every pass that changed it")
        arg_parser.add_argument(
            "--emit", choices=("ir", "json", "ast", "memory-report", "memory-plot", "cost-report", "recompute-report",
                               "comm-report"),
            default="ir",
            help="for Module DSL input (.module): 'ast' prints the parsed AST; after the pipeline, "
            "'json' writes the IR as JSON (docs/json-ir.md; mdsl-opt reads FILE.json back), "
            "'memory-report' prints each program's arena sizes, peak and largest buffers, "
            "'memory-plot FILE.png' draws its buffers over the schedule steps (planned programs only), and "
            "'cost-report' estimates each mdsl.sched program's time per op kind: launches, bytes read and "
            "written, FLOPs and roofline time (max(bytes / bandwidth, FLOPs / peak) per op, summed), and "
            "'recompute-report' prints the automatic mode's choice of mdsl-recompute (each tensor's bytes and "
            "recompute FLOPs per layer, saved or recomputed), and 'comm-report' the bytes each rank sends in "
            "each mdsl.sched program's collectives")
        arg_parser.add_argument("--cost-bandwidth", default=None, metavar="BYTES/S",
                                help="for --emit=cost-report: the memory bandwidth in bytes/s (default 3.35e12, "
                                "an H100 SXM)")
        arg_parser.add_argument("--cost-flops", default=None, metavar="FLOP/S",
                                help="for --emit=cost-report: the peak FLOP/s (default 989e12, an H100 SXM's "
                                "dense bf16)")
        arg_parser.add_argument("--plot-file", default=None, metavar="FILE.png",
                                help="where --emit=memory-plot writes its PNG (also given as --emit=memory-plot "
                                "FILE.png)")
        arg_parser.add_argument("--diagnostics-format", choices=("text", "json"), default="text",
                                help="how diagnostics are printed")

    def register_module_arguments(self, arg_parser: argparse.ArgumentParser) -> None:
        arg_parser.add_argument("--lock", action="store_true",
                                help="for Module DSL input: write NAME.module.lock (the resolved imports, their "
                                "versions and content hashes) beside NAME.module")
        arg_parser.add_argument("--locked", action="store_true",
                                help="for Module DSL input: fail (E039) when an import differs from NAME.module.lock")
        arg_parser.add_argument("--top", default=None,
                                help="for Module DSL input: the declaration to lower (default: the model, else the "
                                "last declaration)")
        arg_parser.add_argument("--hf", default=None, metavar="DIR",
                                help="for Module DSL input: lower with the configuration of this HuggingFace "
                                "checkpoint's config.json")
        arg_parser.add_argument("--force-architecture", action="store_true",
                                help="with --hf: accept a checkpoint whose architecture the model does not declare "
                                "(E036 becomes W010)")

    def register_verify_backward_arguments(self, arg_parser: argparse.ArgumentParser) -> None:
        arg_parser.add_argument(
            "--verify-backward", action="store_true",
            help="check the model's backward against float64 finite differences (random weights and inputs, "
            "seed 0) and print each tensor's relative error instead of the IR; exit 1 when one is above the "
            "tolerance. The backward checked is the written one (a backward: section, @backward) where the "
            "model has one, else the gradient mdsl-autodiff derives")
        arg_parser.add_argument("--verify-derived", action="store_true",
                                help="for --verify-backward: check the derived gradient (mdsl-autodiff) even where "
                                "the model has a written backward")
        arg_parser.add_argument("--verify-shapes", default=None, metavar="B=2,T=8",
                                help="for --verify-backward: sizes of the symbols (default B=2,T=8; '*' dims are B, "
                                "T) and of integer model parameters (a Module DSL model's parameters are lowered "
                                "with them)")
        arg_parser.add_argument("--verify-tolerance", default=None, metavar="TOL",
                                help="for --verify-backward: the largest relative error that passes (default 1e-3)")
        arg_parser.add_argument("--verify-epsilon", default=None, metavar="EPS",
                                help="for --verify-backward: the finite-difference step (default 1e-6)")

    # ------------------------------------------------------------------ the pipeline

    def setup_pipeline(self) -> None:
        if self.args.pass_pipeline is not None:
            if self.args.passes:
                raise UserError("give the pipeline with either -p or --pass-pipeline, not both")
            self.args.passes = self.args.pass_pipeline
        shown = self.args.passes
        text, offset = normalize_pipeline(shown)
        self.passes = [self.with_device_facts(p) for p in build_pipeline(self.available_passes, text, offset, shown)]
        self.observer = PipelineObserver(
            print_ir=self.print_for_dump,
            before=pass_names_flag(self.available_passes, "--print-ir-before", self.args.print_ir_before),
            before_all=self.args.print_ir_before_all,
            after=pass_names_flag(self.available_passes, "--print-ir-after", self.args.print_ir_after),
            after_all=self.args.print_ir_after_all,
            after_change=self.args.print_ir_after_change,
            verify=None if self.args.disable_verify else self.verify_after_pass,
        )

    def with_device_facts(self, pass_: ModulePass) -> ModulePass:
        """``mdsl-recompute`` given what a pass may not find out itself: the device's free memory for
        ``budget=auto``, and where its automatic mode's table goes (``--emit=recompute-report``)."""
        if pass_.name != "mdsl-recompute":
            return pass_
        if str(pass_.budget) == "auto" and not pass_.free_memory:
            from modeldsl.runtime.device_memory import free_memory_bytes

            pass_ = dataclasses.replace(pass_, free_memory=free_memory_bytes())
        if self.args.emit == "recompute-report":
            pass_ = pass_.reporting(self.recompute_tables.append)
        return pass_

    def print_for_dump(self, module: ModuleOp) -> str:
        return print_ir(module, generic=self.args.print_op_generic, debuginfo=self.args.print_debuginfo)

    def verify_after_pass(self, module: ModuleOp, pass_: ModulePass) -> None:
        """After each pass: the IR still verifies (raises the failures as located diagnostics)."""
        diagnostics = verify_module(module, self._op_spans)
        if diagnostics:
            raise InvalidAfterPass(diagnostics, pass_.name)

    def apply_passes(self, prog: ModuleOp) -> None:
        if not self.args.disable_verify:
            with self.observer.timed("Verifier"):
                diagnostics = verify_module(prog, self._op_spans)
            if diagnostics:
                raise DiagnosticError([d.diagnostic() for d in diagnostics])
        if self.verify is not None:
            self.specialize_for_verify(prog)
        try:
            self.run_pipeline(prog)
        except InvalidAfterPass as err:
            raise DiagnosticError(self.after_pipeline_diagnostics(err.diagnostics, err.pass_name)) from None
        except (VerifyException, DiagnosticException):
            diagnostics = verify_module(prog)
            if not diagnostics:
                raise
            raise DiagnosticError(self.after_pipeline_diagnostics(diagnostics)) from None
        except Exception as err:
            if not self.args.disable_verify:
                raise
            diagnostics = verify_module(prog, self._op_spans)
            if not diagnostics:
                raise
            raise DiagnosticError(self.unverified_input_diagnostics(diagnostics, err)) from None

    @staticmethod
    def unverified_input_diagnostics(diagnostics, err: Exception) -> list[Diagnostic]:
        """What a pass failed on when --disable-verify let IR that does not verify into it."""
        out = []
        for d in diagnostics:
            diag = d.diagnostic()
            diag.hint = (f"--disable-verify let this invalid IR into the pipeline, and a pass failed on it "
                         f"({type(err).__name__}: {err}); fix the IR, or drop --disable-verify to see every problem")
            out.append(diag)
        return out

    def run_pipeline(self, prog: ModuleOp) -> None:
        if not self.args.print_between_passes:
            self.observer.run(self.passes, self.ctx, prog)
            return
        for k, pass_ in enumerate(self.passes):  # xDSL's --print-between-passes: to stdout
            self.observer.run([pass_], self.ctx, prog)
            if k + 1 < len(self.passes):
                sys.stdout.write(f"IR after {pass_.name}:\n{self.print_for_dump(prog)}\n\n\n")

    def after_pipeline_diagnostics(self, diagnostics, pass_name: str | None = None) -> list[Diagnostic]:
        """Verifier failures after the pipeline, saying what made them."""
        steps = [f"--verify-shapes {self.verify.text()}"] if self.verify is not None else []
        steps += [self.args.passes] if self.args.passes else []
        where = f"after {' and '.join(steps)}: " if steps else ""
        out = []
        for d in diagnostics:
            diag = d.diagnostic()
            diag.code = "E004" if diag.code == "E041" else diag.code
            diag.message = f"{where}{diag.message}"
            diag.hint = (f"the IR stopped verifying after the pass {pass_name}; " if pass_name else "") + \
                "the passes or bound values make the IR invalid; check them against the model's constraints"
            out.append(diag)
        return out

    # ------------------------------------------------------------------ running

    def run(self) -> None:
        if self.args.list_passes:
            sys.stdout.write(pass_list(self.available_passes))
            return
        source = self.read_input()
        if self.args.split_input_file and source.kind != "mlir":
            raise flag_error(f"--split-input-file cuts IR text at '// -----'; '{source.name}' is "
                             f"{SPLIT_KINDS[source.kind]}, which is read whole",
                             "drop --split-input-file, or put each case in a file of its own (a .mlir input "
                             "splits; --verify-diagnostics checks the annotations of a whole .module file)")
        if source.kind in ("module", "py"):
            result = self.run_module_dsl(source)
        elif source.kind == "json":
            result = self.run_json(source)
        else:
            result = self.run_mlir(source)
        with self.observer.timed("Write output"):
            self.write_output(result)
        if self.args.time_passes:
            sys.stderr.write(timing_report(self.observer.steps))

    def read_input(self) -> InputText:
        """The input text and kind; E028 for a path that cannot be read (never blocks on a
        FIFO or device), E001 for bytes that are not UTF-8, E029 for an unknown kind."""
        from modeldsl.frontend.text.parser import decode_source

        path = self.args.input_file
        from_stdin = path in (None, "-")
        name = "<stdin>" if from_stdin else path
        with self.observer.timed("Read input"):
            data = sys.stdin.buffer.read() if from_stdin else read_regular_file(path)
            text = decode_source(data, name)
        kind = self.args.frontend or ("mlir" if from_stdin else os.path.splitext(path)[1].lstrip("."))
        if kind not in self.available_frontends:
            raise flag_error(f"cannot tell the kind of '{name}' from its extension '.{kind}'",
                             "name it .mlir, .module, .py (the Python DSL) or .json, or give the kind with -f mlir / "
                             "-f module / -f py / -f json")
        remember_source(name, text)
        return InputText(name, text, kind, None if from_stdin else path)

    def write_output(self, result: ChunkResult) -> None:
        if self.args.output_file is None:
            sys.stdout.write(result.output)
            return
        from modeldsl.files import write_file

        try:
            write_file(self.args.output_file, result.output)  # atomically: the file whole, nothing else touched
        except OSError as err:
            raise DiagnosticError([Diagnostic("E028", f"cannot write '{self.args.output_file}': "
                                              f"{err.strerror or err}", None, "check the -o path")]) from None

    def run_mlir(self, source: InputText) -> ChunkResult:
        """Each chunk (``--split-input-file``) parsed, verified, run through the pipeline."""
        results = []
        for text, line_offset in self.chunks(source.text):
            result = self.collect(functools.partial(self.process_mlir_chunk, source.name, text, line_offset))
            if source.path is None and not self.args.frontend:
                for diag in result.diagnostics:
                    if diag.code == "E001" and not diag.hint:
                        diag.hint = "stdin is read as IR; give -f module for Module DSL text"
            if self.args.verify_diagnostics:
                self.check_expectations(result, Source(source.name, source.text), line_offset + 1,
                                        line_offset + text.count("\n") + 1)
            elif result.diagnostics:
                if not self.prints_diagnostics(result.diagnostics):
                    raise DiagnosticError(result.diagnostics)
                result.output = render_all(result.diagnostics)
            results.append(result.output)
        return ChunkResult("// -----\n".join(results))

    def prints_diagnostics(self, diagnostics: list[Diagnostic]) -> bool:
        """Whether the chunk's diagnostics are the output (exit 0) rather than errors:
        ``--print-diagnostics``, or ``--parsing-diagnostics`` for syntax errors."""
        return self.args.print_diagnostics or (self.args.parsing_diagnostics and _is_parse_error(diagnostics))

    def chunks(self, text: str) -> list[tuple[str, int]]:
        if not self.args.split_input_file:
            return [(text, 0)]
        pieces = text.split("// -----")
        offsets, line = [], 0
        for piece in pieces:
            offsets.append(line)
            line += piece.count("\n")
        return list(zip(pieces, offsets))

    def process_mlir_chunk(self, name: str, text: str, line_offset: int) -> str:
        with self.observer.timed("Parser"):
            module = self.parse_mlir_text(text, name, line_offset)
        self.apply_passes(module)
        with self.observer.timed("Output"):
            return self.output_resulting_program(module)

    def parse_mlir_text(self, text: str, name: str, line_offset: int = 0) -> ModuleOp:
        try:
            parser = LocatingParser(self.ctx, text, name, line_offset)  # lexes the first token: may fail too
            module = parser.parse_module(not self.args.no_implicit_module)
        except ParseError as err:
            span = err.span if not line_offset else _with_line_offset(err.span, line_offset)
            raise DiagnosticError([Diagnostic("E001", err.msg, source_span(span))]) from None
        spans = parser.op_spans
        if line_offset:
            spans = {op: _with_line_offset(span, line_offset) for op, span in spans.items()}
        self._op_spans = spans
        return module

    def run_json(self, source: InputText) -> ChunkResult:
        """The JSON IR (:mod:`modeldsl.json_ir`) read, verified and run through the pipeline."""
        result = self.collect(lambda: self.process_json(source.name, source.text))
        if result.diagnostics:
            raise DiagnosticError(result.diagnostics)
        return result

    def process_json(self, name: str, text: str) -> str:
        with self.observer.timed("Parser"):
            module = self.parse_json_text(text, name)
        self.apply_passes(module)
        with self.observer.timed("Output"):
            return self.output_resulting_program(module)

    def parse_json_text(self, text: str, name: str) -> ModuleOp:
        """E001 at the JSON path of what is not JSON IR; the IR's own verifier failures as coded
        diagnostics (at the DSL locations the IR carries)."""
        from modeldsl.json_ir import JsonIRError, read_json

        try:
            module = read_json(self.ctx, text)
        except JsonIRError as err:
            raise DiagnosticError([Diagnostic("E001", f"{name}: {err}", None, "write it with mdsl-opt --emit=json "
                                              "(docs/json-ir.md describes the format)")]) from None
        problems = verify_module(module)
        if problems:
            raise DiagnosticError([p.diagnostic() for p in problems])
        self._op_spans = {}
        return module

    def parse_json_stream(self, stream: IO[bytes]) -> ModuleOp:
        """xDSL's frontend hook for JSON IR."""
        return self.parse_json_text(stream.read().decode("utf-8", "replace"), self.get_input_name())

    def parse_mlir_stream(self, stream: IO[bytes]) -> ModuleOp:
        """xDSL's frontend hook for IR text."""
        return self.parse_mlir_text(stream.read().decode("utf-8", "replace"), self.get_input_name())

    def lower_module_stream(self, stream: IO[bytes]) -> ModuleOp:
        """xDSL's frontend hook for Module DSL text: parsed and lowered with its defaults."""
        from modeldsl.frontend.text.parser import parse_source
        from modeldsl.lower import lower_program

        return lower_program(parse_source(stream.read().decode("utf-8", "replace"), self.get_input_name()),
                             self.args.top)

    def lower_python_stream(self, stream: IO[bytes]) -> ModuleOp:
        """xDSL's frontend hook for the Python DSL: read (never run) and lowered with its defaults."""
        from modeldsl.frontend.python import parse_python_source
        from modeldsl.lower import lower_program

        return lower_program(parse_python_source(stream.read().decode("utf-8", "replace"), self.get_input_name()),
                             self.args.top)

    def collect(self, step) -> ChunkResult:
        """Run a step; its coded diagnostics (errors and warnings) are kept, not raised."""
        result = ChunkResult()
        try:
            result.output = step()
        except DiagnosticError as err:
            result.diagnostics = list(err.diagnostics)
        except LocatedParseError as err:
            result.diagnostics = [err.diagnostic()]
        return result

    def check_expectations(self, result: ChunkResult, source: Source, first: int, last: int) -> None:
        """``--verify-diagnostics``: the chunk's diagnostics against its annotations."""
        from modeldsl.tools.verify_diagnostics import check, expectations

        failures = check(expectations(source, first, last), result.diagnostics, source.name)
        if failures:
            raise DiagnosticError(failures)

    # ------------------------------------------------------------------ Module DSL

    def run_module_dsl(self, source: InputText) -> ChunkResult:
        """Parse, check and lower Module DSL text and give the mdsl.graph IR (after the
        pipeline); ``--emit=ast`` gives its AST instead."""
        self.lowering_warnings: list[Diagnostic] = []
        result = self.collect(lambda: self.process_module(source))
        result.diagnostics += self.lowering_warnings
        if self.args.verify_diagnostics:
            self.check_expectations(result, Source(source.name, source.text), 1, source.text.count("\n") + 1)
            return result
        warnings = [d for d in result.diagnostics if d.severity == "warning"]
        if len(warnings) != len(result.diagnostics):
            raise DiagnosticError(result.diagnostics)
        if warnings:
            sys.stderr.write(render_all(warnings, self.args.diagnostics_format))
        return result

    def process_module(self, source: InputText) -> str:
        from modeldsl.diagnostics import DiagnosticSink
        from modeldsl.frontend.text.ast import dump
        from modeldsl.frontend.text.parser import parse_source
        from modeldsl.lower import lower_program

        with self.observer.timed("Parser"):
            if source.kind == "py":
                from modeldsl.frontend.python import parse_python_source

                program = parse_python_source(source.text, source.name)
            else:
                program = parse_source(source.text, source.name)
        if self.args.emit == "ast":
            return dump(program)
        self.check_lock_flags(program, source)
        sink = DiagnosticSink()
        config = self.checkpoint_config(program) if self.args.hf else None
        if self.verify is not None:
            config = self.verify_lowering_config(program, config)
        with self.observer.timed("Lowering"):
            module = lower_program(program, self.args.top, config, sink=sink)
        self._op_spans = {}
        self.apply_passes(module)
        self.lowering_warnings = sink.diagnostics
        with self.observer.timed("Output"):
            return self.output_resulting_program(module)

    def check_lock_flags(self, program, source: InputText) -> None:
        from modeldsl.tools.opt_lock import check_lock, write_lock

        if (self.args.lock or self.args.locked) and source.path is None:
            raise flag_error("--lock and --locked need the .module file's path, not stdin",
                             "give the file: mdsl-opt --lock model.module")
        if self.args.lock and self.args.locked:
            raise flag_error("--lock writes the lock file and --locked checks it: give one of them")
        if self.args.locked:
            check_lock(program, source.path)
        if self.args.lock:
            lock = write_lock(program, source.path)
            print(f"mdsl-opt: wrote {lock}", file=sys.stderr)

    def checkpoint_config(self, program) -> dict:
        """The model's parameters from ``--hf DIR``'s config.json, through its hf_config."""
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

    # ------------------------------------------------------------------ output

    def output_resulting_program(self, prog: ModuleOp) -> str:
        """The IR, or with ``--emit=memory-report`` the memory report, with
        ``--emit=cost-report`` the cost report, or with ``--emit=memory-plot``
        nothing (the plot goes to its file)."""
        if self.verify is not None:
            return self.verify_backward_report(prog)
        if self.args.emit == "cost-report":
            return self.cost_report(prog)
        if self.args.emit == "recompute-report":
            return self.recompute_report()
        if self.args.emit == "comm-report":
            return self.comm_report(prog)
        if self.args.emit == "json":
            from modeldsl.json_ir import dumps

            return dumps(prog)
        if self.args.emit not in ("memory-report", "memory-plot"):
            return super().output_resulting_program(prog)
        from modeldsl.memory_report import NotPlanned, memory_report, plot_memory

        try:
            if self.args.emit == "memory-report":
                return memory_report(prog)
            self.write_plot(prog, plot_memory)
        except NotPlanned as err:
            raise UserError(str(err)) from None
        print(f"mdsl-opt: wrote {self.args.plot_file}", file=sys.stderr)
        return ""

    def comm_report(self, prog: ModuleOp) -> str:
        """``--emit=comm-report``: the bytes each rank sends in each mdsl.sched program."""
        from modeldsl.comm_report import comm_report
        from modeldsl.dialects.sched import ProgramOp

        if not any(isinstance(op, ProgramOp) for op in prog.walk()):
            raise flag_error("--emit=comm-report: the pipeline made no mdsl.sched program",
                             "end the pipeline with mdsl-lower-to-sched, or run a named pipeline "
                             "(mdsl-train-step{B=2 T=16 dp=2})")
        return comm_report(prog)

    def recompute_report(self) -> str:
        """``--emit=recompute-report``: the table of each automatic ``mdsl-recompute`` of the pipeline."""
        if not self.recompute_tables:
            raise flag_error("--emit=recompute-report: no mdsl-recompute ran in the automatic mode",
                             "give mdsl-recompute (or mdsl-train-step) a budget: budget=2GiB, or budget=auto")
        tables, self.recompute_tables = self.recompute_tables, []
        return "\n".join(tables) + "\n"

    def write_plot(self, prog: ModuleOp, plot_memory) -> None:
        """``--emit=memory-plot FILE.png``: the plot (written atomically); E028 where it cannot be."""
        try:
            plot_memory(prog, self.args.plot_file)
        except OSError as err:
            raise DiagnosticError([Diagnostic("E028", f"cannot write '{self.args.plot_file}': "
                                              f"{err.strerror or err}", None, "check the memory-plot path")]) from None

    def cost_report(self, prog: ModuleOp) -> str:
        """``--emit=cost-report``: the roofline estimate of every mdsl.sched program."""
        from modeldsl.cost import NoSchedProgram, cost_report

        try:
            return cost_report(prog, self.roofline)
        except NoSchedProgram as err:
            raise flag_error(f"--emit=cost-report: {err}",
                             "lower to mdsl.sched first: -p '...,mdsl-lower-to-sched,mdsl-plan-memory'") from None


def cost_roofline(args: argparse.Namespace):
    """The device of ``--emit=cost-report`` from ``--cost-bandwidth``/``--cost-flops``
    (E029 for a value that is not a finite number above 0, or a flag without the report);
    None without the report (the cost model is imported only for it)."""
    given = [f for f, v in (("--cost-bandwidth", args.cost_bandwidth), ("--cost-flops", args.cost_flops))
             if v is not None]
    if args.emit != "cost-report":
        if given:
            raise flag_error(f"{given[0]} is an option of --emit=cost-report", "add --emit=cost-report")
        return None
    from modeldsl.cost import H100_SXM, Roofline

    if not given:
        return H100_SXM
    return Roofline(positive_float("--cost-bandwidth", args.cost_bandwidth, H100_SXM.bandwidth),
                    positive_float("--cost-flops", args.cost_flops, H100_SXM.peak_flops),
                    name="given peaks")


class InvalidAfterPass(Exception):
    """The IR no longer verifies after a pass."""

    def __init__(self, diagnostics, pass_name: str):
        super().__init__(f"{len(diagnostics)} verifier failure(s) after {pass_name}")
        self.diagnostics = diagnostics
        self.pass_name = pass_name


def add_alias(parser: argparse.ArgumentParser, action: argparse.Action, option: str) -> None:
    """Let ``option`` (an mlir-opt spelling) set what ``action`` sets."""
    action.option_strings.append(option)
    parser._option_string_actions[option] = action  # noqa: SLF001 - argparse has no public alias API


def _with_line_offset(span, line_offset: int):
    import dataclasses

    return dataclasses.replace(span, line_offset=line_offset)


def _is_parse_error(diagnostics: list[Diagnostic]) -> bool:
    return all(d.code == "E001" for d in diagnostics)


def main(argv: Sequence[str] | None = None) -> int:
    post_init = Attribute.__post_init__  # xDSL's --disable-verify replaces it for the whole process
    try:
        return run_tool(argv)
    finally:
        Attribute.__post_init__ = post_init


def run_tool(argv: Sequence[str] | None) -> int:
    """mdsl-opt on ``argv``: its exit code, every problem reported as a coded diagnostic."""
    tool = None
    try:
        load_from_environment()  # MDSL_PRIMITIVES: modules registering user primitives
        tool = MdslOptMain(args=argv)
        tool.run()
        if tool.verify_failed:
            return 1
    except DiagnosticError as err:
        fmt = tool.args.diagnostics_format if tool is not None else requested_format(argv)
        return report(err.diagnostics, fmt)
    except UserError as err:
        return report([Diagnostic("E029", str(err))], "text")
    except (ParseError, DiagnosticException) as err:  # xDSL's own, outside a located step
        return report([Diagnostic("E041", str(err).strip())], "text")
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


def requested_format(argv: Sequence[str] | None) -> str:
    """``--diagnostics-format`` from the raw arguments (for errors before they are parsed)."""
    args = list(sys.argv[1:] if argv is None else argv)
    for k, arg in enumerate(args):
        if arg == "--diagnostics-format=json" or (arg == "--diagnostics-format" and args[k + 1:k + 2] == ["json"]):
            return "json"
    return "text"


def report(diagnostics: list[Diagnostic], fmt: str) -> int:
    """Print diagnostics (JSON to stdout, text to stderr); 1 when one is an error."""
    stream = sys.stdout if fmt == "json" else sys.stderr
    stream.write(render_all(diagnostics, fmt))
    return 1 if any(d.severity == "error" for d in diagnostics) else 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["MdslOptMain", "main", "ModulePass"]
