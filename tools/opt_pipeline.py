"""``mdsl-opt``'s pass pipeline: checked parsing, the pass list, IR dumps and timing.

The pipeline text (``-p``/``--pass-pipeline``) is parsed here with its token
positions kept, so a syntax error, an unknown pass or an unknown option is a
coded diagnostic at ``<pipeline>:1:col`` with a caret under the pipeline text
and a "did you mean" hint. :func:`pass_list` is ``--list-passes`` (every pass,
its options with their types and defaults, a one-line description), from the
registry's listings where it has them, so listing imports no pass.
:class:`PipelineObserver` runs between passes as mlir-opt's instrumentation
does: ``--print-ir-before/after[-all]``, ``--print-ir-after-change`` dump to stderr under
``// -----// IR Dump After Name (pass-name) //----- //`` headers, and
``--mlir-timing`` collects the wall time of each step for :func:`timing_report`.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, get_type_hints

from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.utils.arg_spec import (
    ArgSpec,
    ArgSpecConvertible,
    PipelineLexer,
    SpecToken,
    SpecTokenKind,
    _convert_arg_to_type,  # noqa: PLC2701 - the conversion from_spec does, to name the bad option
    _parse_spec,  # noqa: PLC2701 - the one parser of pipeline elements
)
from xdsl.utils.exceptions import ArgSpecParseError

from modeldsl.diagnostics import Diagnostic, DiagnosticError, PassOptionError, Source, Span
from modeldsl.passes.registry import LISTINGS, OPTION_NOTES, PassFactory, PassListing, describe_pass

PIPELINE_NAME = "<pipeline>"


# ----------------------------------------------------------------------------- parsing


class _RecordingLexer(PipelineLexer):
    """A pipeline lexer that keeps every token it hands out and, as MLIR's pipeline
    parser does, skips spaces between passes (``cse, dce``); inside ``{...}`` a space
    still separates options."""

    def __init__(self, text: str):
        super().__init__(text)
        self.tokens: list[SpecToken] = []
        self.depth = 0

    def peek(self) -> SpecToken:
        token = super().peek()
        while self.depth == 0 and token.kind is SpecTokenKind.SPACE:
            self._peeked = None
            token = super().peek()
        return token

    def lex(self) -> SpecToken:
        token = super().lex()
        self.depth += {SpecTokenKind.L_BRACE: 1, SpecTokenKind.R_BRACE: -1}.get(token.kind, 0)
        self.tokens.append(token)
        return token


@dataclasses.dataclass
class PassSpec:
    """One element of the pipeline with the positions of its name and option keys."""

    spec: ArgSpec
    name_at: tuple[int, int]
    option_at: dict[str, tuple[int, int]]


def pipeline_error(text: str, where: tuple[int, int], message: str, hint: str = "",
                   code: str = "E029") -> DiagnosticError:
    """A coded diagnostic with a caret under ``text[where[0]:where[1]]``."""
    start, end = where
    span = Span(Source(PIPELINE_NAME, text), 1, start + 1, 1, max(end, start + 1) + 1)
    return DiagnosticError([Diagnostic(code, message, span, hint)])


def parse_pipeline_text(text: str, offset: int = 0, shown: str | None = None) -> list[PassSpec]:
    """The elements of a pipeline; ``text`` sits at ``offset`` in the ``shown`` text
    the user typed (which may wrap it in ``builtin.module(...)``)."""
    shown = text if shown is None else shown
    lexer = _RecordingLexer(text)
    specs: list[PassSpec] = []
    try:
        while lexer.peek().kind is not SpecTokenKind.EOF:
            first = len(lexer.tokens)
            spec = _parse_spec(lexer)
            specs.append(_located_spec(spec, lexer.tokens[first:], offset))
            separator = lexer.lex()
            if separator.kind is SpecTokenKind.EOF:
                break
            if separator.kind is not SpecTokenKind.COMMA:
                raise pipeline_error(shown, _at(separator, offset), "pass pipeline: expected ',' between passes",
                                     "write passes as 'a,b{option=value}'", "E001")
    except ArgSpecParseError as err:
        message, where = _parse_error_at(err, len(text))
        raise pipeline_error(shown, (where[0] + offset, where[1] + offset), f"pass pipeline: {message}",
                             "write passes as 'a,b{option=value other=1}'", "E001") from None
    except ValueError as err:  # an option value xDSL cannot convert (an integer past 4300 digits)
        where = _at(lexer.tokens[-1], offset) if lexer.tokens else (offset, offset + len(text))
        raise pipeline_error(shown, where, f"pass pipeline: {str(err).split(';')[0]}",
                             "give option values of the option's type and of a sensible size", "E001") from None
    return specs


def _at(token: SpecToken, offset: int) -> tuple[int, int]:
    return token.span.start + offset, token.span.end + offset


def _parse_error_at(err: ArgSpecParseError, length: int) -> tuple[str, tuple[int, int]]:
    """xDSL's message and the columns its caret marks (xDSL prints them, it keeps no token)."""
    lines = str(err).rstrip("\n").split("\n")
    message = lines[-1].strip() if len(lines) >= 5 else lines[-1]
    caret = lines[3] if len(lines) >= 5 else ""
    start = caret.find("^")
    if start < 0:
        return message, (length, length + 1)
    end = len(caret) - len(caret[start:].lstrip("^"))
    return message[:1].lower() + message[1:], (start, end)


def _located_spec(spec: ArgSpec, tokens: list[SpecToken], offset: int) -> PassSpec:
    name_at = _at(tokens[0], offset)
    options: dict[str, tuple[int, int]] = {}
    expect_key = False
    for token in tokens[1:]:
        if token.kind in (SpecTokenKind.L_BRACE, SpecTokenKind.SPACE):
            expect_key = True
        elif expect_key and token.kind is SpecTokenKind.IDENT:
            options.setdefault(token.span.text.replace("-", "_"), _at(token, offset))
            expect_key = False
        else:
            expect_key = False
    return PassSpec(spec, name_at, options)


def build_pipeline(available: dict[str, PassFactory], text: str, offset: int = 0,
                   shown: str | None = None) -> list[ModulePass]:
    """The passes of a pipeline, each checked: unknown names and options are E029
    with a caret under them and a "did you mean" hint. A named pipeline
    (:mod:`modeldsl.passes.pipelines`) is expanded into its stages, so every stage
    is dumped, verified and timed as a pass of its own."""
    shown = text if shown is None else shown
    passes = []
    for element in parse_pipeline_text(text, offset, shown):
        name = element.spec.name
        if name not in available:
            raise pipeline_error(shown, element.name_at, f"unknown pass '{name}'",
                                 suggestion(name, list(available), "mdsl-opt --list-passes lists the passes"))
        cls = available[name]()
        _check_options(cls, element, shown)
        try:
            passes.extend(expanded(cls.from_spec(element.spec)))
        except ValueError as err:
            raise _option_value_error(cls, element, shown, err) from None
    return passes


def expanded(pass_: ModulePass) -> list[ModulePass]:
    """A pass, or the stages of a named pipeline (which has ``stages()``), nested ones expanded too."""
    stages = getattr(pass_, "stages", None)
    if stages is None:
        return [pass_]
    return [inner for stage in stages() for inner in expanded(stage)]


def _option_value_error(cls: type[ModulePass], element: PassSpec, shown: str, err: ValueError) -> DiagnosticError:
    """E029 at the option whose value does not convert to its field's type, or that the pass refuses."""
    hint = f"mdsl-opt --list-passes shows the options of {cls.name}"
    if isinstance(err, PassOptionError):
        return pipeline_error(shown, element.option_at.get(err.option, element.name_at), str(err), err.hint or hint)
    types = get_type_hints(cls)
    for key, values in element.spec.normalize_parameter_names().parameters.items():
        try:
            _convert_arg_to_type(values, types[key])
        except (KeyError, ValueError):
            given = ",".join(str(v) for v in values)
            wanted = _type_name(types.get(key, "?"))
            return pipeline_error(shown, element.option_at.get(key, element.name_at),
                                  f"{cls.name}: {key}={given} is not a{'n' if wanted[:1] in 'aeiou' else ''} {wanted}",
                                  hint)
    return pipeline_error(shown, element.name_at, f"{cls.name}: {err}", hint)


def _check_options(cls: type[ModulePass], element: PassSpec, shown: str) -> None:
    """E029 for an option the pass does not have (passes that read free-form options,
    like mdsl-specialize's NAME=VALUE bindings, check their own)."""
    if _reads_own_options(cls):
        return
    known = [f.name for f in dataclasses.fields(cls) if f.init and f.name != "name"]
    for key, where in element.option_at.items():
        if key not in known:
            listed = ", ".join(known) if known else "none"
            raise pipeline_error(shown, where, f"{cls.name} has no option '{key}'",
                                 suggestion(key, known, f"its options: {listed}"))


def _reads_own_options(cls: type[ModulePass]) -> bool:
    return getattr(cls.from_spec, "__func__", None) is not ArgSpecConvertible.from_spec.__func__


def suggestion(word: str, choices: list[str], otherwise: str) -> str:
    """"did you mean '...'?" for the choice closest to ``word``, else ``otherwise``."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else otherwise


def normalize_pipeline(spec: str) -> tuple[str, int]:
    """A pipeline without an MLIR-style ``builtin.module(...)`` wrapper, and where it starts."""
    stripped = spec.strip()
    start = len(spec) - len(spec.lstrip())
    for prefix in ("builtin.module(", "any("):
        if stripped.startswith(prefix):
            inner = stripped[len(prefix) : -1 if stripped.endswith(")") else len(stripped)]
            lead = len(inner) - len(inner.lstrip())
            return inner.strip(), start + len(prefix) + lead
    return stripped, start


def pass_names_flag(available: dict[str, PassFactory], flag: str, value: str | None) -> set[str]:
    """The pass names of ``--print-ir-before=a,b`` (E029 for an unknown one)."""
    if not value:
        return set()
    names = {n.strip() for n in value.split(",") if n.strip()}
    for name in sorted(names):
        if name not in available:
            raise DiagnosticError([Diagnostic("E029", f"{flag}: unknown pass '{name}'", None,
                                              suggestion(name, list(available),
                                                          "mdsl-opt --list-passes lists the passes"))])
    return names


# ----------------------------------------------------------------------------- the pass list


def pass_list(available: dict[str, PassFactory]) -> str:
    """``--list-passes``: each pass, a one-line description and its options with defaults."""
    lines = ["Available passes:"]
    for name, factory in available.items():
        listing = pass_listing(name, factory)
        lines.append(f"  {name}")
        lines.append(f"      {listing.description}")
        for option, text in listing.options:
            lines.append(f"      {option:<30} {text}".rstrip())
        if listing.patterns:
            lines.append("      patterns:")
            lines += [f"        {pattern:<28} {classes}" for pattern, classes in listing.patterns]
        if listing.expansion:
            lines.append(f"      stages: {listing.expansion}")
    return "\n".join(lines) + "\n"


def pass_listing(name: str, factory: PassFactory) -> PassListing:
    """The registry's listing of the pass (importing nothing), else what its class says."""
    listing = LISTINGS.get(name)
    return listing if listing is not None else listing_of_class(name, factory())


def listing_of_class(name: str, cls: type[ModulePass]) -> PassListing:
    """What the pass class says of itself: its description, its options with defaults and, for a
    named pipeline, the stages of its example (``B=2 T=16``)."""
    example = getattr(cls, "example", None)
    expansion = ",".join(str(stage) for stage in expanded(example())) if example is not None else ""
    return PassListing(describe_pass(name, cls), tuple(_option_lines(name, cls)), expansion, pass_patterns(cls))


def pass_patterns(cls: type[ModulePass]) -> tuple[tuple[str, str], ...]:
    """The rewrite patterns of a pass: the ``PATTERNS`` table (name -> pattern classes) of its module."""
    table = getattr(sys.modules.get(cls.__module__), "PATTERNS", None)
    if not isinstance(table, dict):
        return ()
    return tuple((name, ", ".join(c.__name__ for c in classes)) for name, classes in table.items())


def _option_lines(name: str, cls: type[ModulePass]) -> list[tuple[str, str]]:
    if name in OPTION_NOTES:
        return list(OPTION_NOTES[name])
    out = []
    for field in dataclasses.fields(cls):
        if not field.init or field.name == "name":
            continue
        default = field.default if field.default is not dataclasses.MISSING else None
        shown = "required" if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING \
            else f"default: {_option_value(default)}"
        out.append((f"{field.name}={_type_name(field.type)}", shown))
    return out


def _option_value(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if value == "" or value is None:
        return "''" if value == "" else "none"
    return str(value)


def _type_name(annotation: object) -> str:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    return text.replace(" | None", "").replace("typing.", "")


# ----------------------------------------------------------------------------- instrumentation


@dataclasses.dataclass
class TimedStep:
    """One line of the timing report; ``depth`` 1 for a pass inside the pipeline."""

    name: str
    seconds: float
    depth: int = 0


@dataclasses.dataclass
class PipelineObserver:
    """What mlir-opt's instrumentation does between passes: IR dumps and timing."""

    print_ir: Callable[[ModuleOp], str]
    before: set[str] = dataclasses.field(default_factory=set)
    after: set[str] = dataclasses.field(default_factory=set)
    before_all: bool = False
    after_all: bool = False
    after_change: bool = False
    verify: Callable[[ModuleOp, ModulePass], None] | None = None
    stream: IO[str] = dataclasses.field(default_factory=lambda: sys.stderr)
    steps: list[TimedStep] = dataclasses.field(default_factory=list)

    @contextmanager
    def timed(self, name: str, depth: int = 0) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.steps.append(TimedStep(name, time.perf_counter() - start, depth))

    def run(self, passes: list[ModulePass], ctx, module: ModuleOp) -> None:
        """Apply the passes in order, dumping, verifying and timing each."""
        with self.timed("'builtin.module' Pipeline"):
            for pass_ in passes:
                self.run_one(pass_, ctx, module)
        pipeline = self.steps.pop()
        inner = [s for s in self.steps if s.depth == 1]
        self.steps = [s for s in self.steps if s.depth != 1] + [pipeline] + inner

    def run_one(self, pass_: ModulePass, ctx, module: ModuleOp) -> None:
        title = f"{type(pass_).__name__} ({pass_.name})"
        dump_before = self.before_all or pass_.name in self.before
        before = self.print_ir(module) if self.after_change or dump_before else ""
        if dump_before:
            self.dump(f"IR Dump Before {title}", before)
        with self.timed(title, depth=1):
            pass_.apply(ctx, module)
        if self.verify is not None:
            with self.timed("Verifier", depth=1):
                self.verify(module, pass_)
        if self.after_all or pass_.name in self.after:
            self.dump(f"IR Dump After {title}", self.print_ir(module))
        elif self.after_change:
            after = self.print_ir(module)
            if after != before:
                self.dump(f"IR Dump After {title}", after)

    def dump(self, title: str, text: str) -> None:
        self.stream.write(f"// -----// {title} //----- //\n{text}")
        if not text.endswith("\n"):
            self.stream.write("\n")
        self.stream.write("\n")


def timing_report(steps: list[TimedStep]) -> str:
    """mlir-opt's ``--mlir-timing`` report, in milliseconds."""
    total = sum(s.seconds for s in steps if s.depth == 0)
    rule = "===" + "-" * 73 + "==="
    lines = [rule, "Execution time report".center(len(rule)).rstrip(), rule,
             f"  Total Execution Time: {total * 1e3:.4f} ms", "", "  ----Wall Time (ms)----  ----Name----"]
    for step in steps + [TimedStep("Total", total)]:
        share = 100.0 * step.seconds / total if total > 0 else 100.0
        lines.append(f"  {step.seconds * 1e3:>10.4f} ({share:5.1f}%)  {'  ' * step.depth}{step.name}")
    return "\n".join(lines) + "\n"
