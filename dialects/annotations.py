"""Annotations of the Module DSL (spec 000 section 7) as typed ``mdsl.graph`` attributes.

One attribute class per annotation (``#mdsl.graph.memory<recompute>``,
``#mdsl.graph.shard<column, tp_size = 4>``, ``#mdsl.graph.frozen``), each
with a schema of typed parameters (enums, names, dtypes, ints, floats,
strings, bools, lists) and the spec's defaults. Parameters equal to their
default are not stored, so printing is canonical and ``parse(print(a)) == a``.
Ops and parameter declarations carry their annotations in an ``annotations``
array attribute (:data:`ANNOTATIONS_ATTR_NAME`).

Beside the annotations of section 7 this covers the few the spec uses
elsewhere: ``@fuse_required`` (7.5.1), ``@recipe`` (7.4.4), ``@alias``,
``@noalias`` (5.11.2) and ``@barrier`` (5.11.5).

The frontend builds annotations with :func:`make_annotation` from the DSL's
positional and keyword arguments; a bad annotation raises
:class:`AnnotationError`, which the frontend reports as E008.
:func:`check_annotation_set` rejects contradictory annotations on one target
and :func:`effective_memory_policy` applies the precedence ladder of 7.2.0.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from xdsl.dialects.builtin import (
    ArrayAttr,
    DictionaryAttr,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
    f64,
    i64,
)
from xdsl.ir import Attribute, Operation, ParametrizedAttribute
from xdsl.irdl import irdl_attr_definition
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

from modeldsl.dialects.assertions import Check, ConditionError, parse_condition
from modeldsl.dialects.dtypes import DTYPE_SPELLINGS, DType
from modeldsl.dialects.fusion_patterns import SPEC_PATTERNS

ANNOTATIONS_ATTR_NAME = "annotations"


class AnnotationError(Exception):
    """A malformed annotation; the frontend reports it as E008 with ``hint``."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint


# ----------------------------------------------------------------------------
# Parameter schemas
# ----------------------------------------------------------------------------

TEXT_KINDS = ("enum", "name", "dtype", "str")
WORD_KINDS = ("enum", "name", "dtype")  # printed bare, without quotes


@dataclass(frozen=True)
class Param:
    """One parameter of an annotation.

    ``kind`` is one of: ``enum`` (a bare word from ``choices``), ``name`` (any
    bare word, e.g. a hook point), ``dtype``, ``int``, ``float``, ``bool``,
    ``str`` (a string literal), ``strs`` (a list of strings), ``ints`` (a list
    of integers). ``default`` None with ``required`` False means optional.
    ``positional`` parameters may be given without their name, in order.
    ``minimum`` bounds numbers from below, excluded when ``strict``.
    """

    name: str
    kind: str
    default: Any = None
    required: bool = False
    choices: tuple[str, ...] = ()
    positional: bool = False
    minimum: float | None = None
    strict: bool = False

    def check(self, annotation: str, value: Any) -> Any:
        """Validate a Python value for this parameter and return it normalized."""
        where = f"@{annotation}({self.name}=...)"
        if self.kind in TEXT_KINDS:
            return self._check_text(where, value)
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise AnnotationError(f"{where} expects true or false, got {value!r}")
            return value
        if self.kind == "int":
            if not _is_int(value):
                raise AnnotationError(f"{where} expects an integer, got {value!r}")
            return self._check_minimum(where, value)
        if self.kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise AnnotationError(f"{where} expects a finite number, got {value!r}")
            return self._check_minimum(where, float(value))
        return self._check_list(where, value)

    def _check_text(self, where: str, value: Any) -> str:
        if not isinstance(value, str):
            raise AnnotationError(f"{where} expects a {self.kind_text()}, got {value!r}")
        if self.kind == "enum" and value not in self.choices:
            raise AnnotationError(f"{where}: '{value}' is not one of {', '.join(self.choices)}")
        if self.kind == "dtype" and value not in DTYPE_SPELLINGS:
            raise AnnotationError(f"{where}: '{value}' is not a dtype ({', '.join(DTYPE_SPELLINGS)})")
        if self.kind == "name" and not value.isidentifier():
            raise AnnotationError(f"{where}: '{value}' is not a name")
        if self.kind == "str" and self.required and not value:
            raise AnnotationError(f"{where} must not be empty")
        return value

    def _check_list(self, where: str, value: Any) -> list[Any]:
        is_item = (lambda v: isinstance(v, str)) if self.kind == "strs" else _is_int
        if not isinstance(value, (list, tuple)) or not all(is_item(v) for v in value):
            noun = "strings" if self.kind == "strs" else "integers"
            raise AnnotationError(f"{where} expects a list of {noun}, got {value!r}")
        return list(value)

    def _check_minimum(self, where: str, value: float) -> float:
        if self.minimum is None:
            return value
        if value < self.minimum or (self.strict and value == self.minimum):
            raise AnnotationError(f"{where} must be {'>' if self.strict else '>='} {self.minimum:g}, got {value}")
        return value

    def kind_text(self) -> str:
        """How error messages name this parameter's kind."""
        return {"enum": "word", "name": "name", "dtype": "dtype", "str": "string"}.get(self.kind, self.kind)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def enum(name: str, choices: Sequence[str], default: str | None = None, positional: bool = False) -> Param:
    """An enum parameter; required when it has no default."""
    return Param(name, "enum", default, required=default is None, choices=tuple(choices), positional=positional)


def required(name: str, kind: str, minimum: float | None = None) -> Param:
    """A required parameter, given first and usually positionally."""
    return Param(name, kind, required=True, positional=True, minimum=minimum)


def optional(name: str, kind: str, default: Any = None, minimum: float | None = None, strict: bool = False) -> Param:
    """An optional keyword parameter with the spec's default (None: absent)."""
    return Param(name, kind, default, minimum=minimum, strict=strict)


# ----------------------------------------------------------------------------
# Storage of values as builtin attributes, and their text form
# ----------------------------------------------------------------------------


def to_attr(param: Param, value: Any) -> Attribute:
    """The builtin attribute that stores a checked value."""
    if param.kind in TEXT_KINDS:
        return StringAttr(value)
    if param.kind == "bool":
        return IntegerAttr(int(value), IntegerType(1))
    if param.kind == "int":
        return IntegerAttr(value, i64)
    if param.kind == "float":
        return FloatAttr(value, f64)
    if param.kind == "strs":
        return ArrayAttr([StringAttr(v) for v in value])
    return ArrayAttr([IntegerAttr(v, i64) for v in value])


def from_attr(param: Param, attr: Attribute) -> Any:
    """The Python value stored in a builtin attribute."""
    if isinstance(attr, StringAttr):
        return attr.data
    if isinstance(attr, IntegerAttr):
        value = attr.value.data
        return bool(value) if param.kind == "bool" else value
    if isinstance(attr, FloatAttr):
        return attr.value.data
    if isinstance(attr, ArrayAttr):
        return [from_attr(Param("item", "str" if param.kind == "strs" else "int"), a) for a in attr.data]
    raise VerifyException(f"unexpected stored value {attr} for parameter '{param.name}'")


def value_text(param: Param, value: Any) -> str:
    """A value as it is printed in IR text."""
    if param.kind in WORD_KINDS:
        return value
    if param.kind == "str":
        return _string_text(value)
    if param.kind == "bool":
        return "true" if value else "false"
    if param.kind == "float":
        return _float_text(value)
    if param.kind == "strs":
        return "[" + ", ".join(_string_text(v) for v in value) + "]"
    if param.kind == "ints":
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def _string_text(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _float_text(value: float) -> str:
    """Shortest round-tripping text that the IR lexer reads as a float (``1.0e-05``)."""
    mantissa, e, exponent = repr(float(value)).partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return mantissa + e + exponent


def parse_value(parser: AttrParser, param: Param) -> Any:
    """Parse one parameter value in IR text (checked later against the schema)."""
    context = f" for '{param.name}'"
    if param.kind == "name":
        quoted = parser.parse_optional_str_literal()  # a quoted name is accepted, printed bare
        return quoted if quoted is not None else parser.parse_identifier(context)
    if param.kind in WORD_KINDS:
        return parser.parse_identifier(context)
    if param.kind == "str":
        return parser.parse_str_literal(context)
    if param.kind == "bool":
        return parser.parse_boolean(context)
    if param.kind == "int":
        return parser.parse_integer(allow_boolean=False)
    if param.kind == "float":
        return float(parser.parse_number(context))
    item = parser.parse_str_literal if param.kind == "strs" else (lambda: parser.parse_integer(allow_boolean=False))
    return parser.parse_comma_separated_list(parser.Delimiter.SQUARE, item)


# ----------------------------------------------------------------------------
# The base attribute
# ----------------------------------------------------------------------------


class _ClassConstant(property):
    """A read-only alias of an upper-case class constant, readable on the class and its instances.

    xDSL reserves lower-case class variables of attribute definitions for
    parameters; a ``property`` is exempt, so the alias is one.
    """

    def __init__(self, constant: str):
        super().__init__()
        self.constant = constant

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        return getattr(owner if owner is not None else type(instance), self.constant)


class AnnotationAttr(ParametrizedAttribute):
    """Base of every annotation attribute: its non-default arguments in a dictionary.

    Subclasses set ``DSL_NAME`` (the name after ``@``, also read as
    ``dsl_name``), ``PARAMS`` (the schema, positional parameters first),
    ``BINDING`` (the spec marks the annotation as one the compiler must
    respect) and ``REPEATABLE`` (one target may carry it more than once), and
    may override :meth:`check_values` for rules across parameters.
    """

    DSL_NAME: ClassVar[str]
    PARAMS: ClassVar[tuple[Param, ...]] = ()
    BINDING: ClassVar[bool] = False
    REPEATABLE: ClassVar[bool] = False
    dsl_name = _ClassConstant("DSL_NAME")

    args: DictionaryAttr

    @classmethod
    def schema(cls) -> dict[str, Param]:
        """The parameters by name."""
        return {p.name: p for p in cls.PARAMS}

    @classmethod
    def of(cls, **values: Any) -> AnnotationAttr:
        """Build from keyword values (validated; defaults dropped); raises AnnotationError."""
        return cls(DictionaryAttr(_canonical_args(cls, values)))

    @property
    def values(self) -> dict[str, Any]:
        """Every parameter's value, defaults included."""
        schema = self.schema()
        result = {p.name: p.default for p in self.PARAMS}
        for key, attr in self.args.data.items():
            result[key] = from_attr(schema[key], attr)
        return result

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def verify(self) -> None:
        """Known, well-typed, non-default parameters; required ones present; cross rules."""
        schema = self.schema()
        for key, attr in self.args.data.items():
            if key not in schema:
                raise VerifyException(f"@{self.dsl_name} has no parameter '{key}'")
            param = schema[key]
            value = _as_verify_error(param.check, self.dsl_name, from_attr(param, attr))
            if value == param.default and not param.required:
                raise VerifyException(f"@{self.dsl_name}: '{key}' equals its default and must be omitted")
        for p in self.PARAMS:
            if p.required and p.name not in self.args.data:
                raise VerifyException(f"@{self.dsl_name} needs '{p.name}'")
        _as_verify_error(self.check_values, self.values)

    @classmethod
    def check_values(cls, values: dict[str, Any]) -> None:
        """Rules across parameters (all values, defaults included); raise AnnotationError."""

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list[Attribute]:
        """``<positional, ..., key = value, ...>``, or nothing when every parameter is defaulted."""
        start = parser.pos
        values: dict[str, Any] = {}
        if parser.parse_optional_punctuation("<") is not None:
            values = _parse_arguments(cls, parser)
            parser.parse_punctuation(">")
        try:
            return [DictionaryAttr(_canonical_args(cls, values))]
        except AnnotationError as err:
            parser.raise_error(err.message, start, parser.pos)

    def print_parameters(self, printer: Printer) -> None:
        """Positional parameters bare while none before them is left out, the rest as ``key = value``."""
        if not self.args.data:
            return
        pieces = []
        bare = True
        for p in self.PARAMS:
            if p.name not in self.args.data:
                bare = bare and not p.positional
                continue
            text = value_text(p, from_attr(p, self.args.data[p.name]))
            pieces.append(text if p.positional and bare else f"{p.name} = {text}")
        printer.print_string("<" + ", ".join(pieces) + ">")


def _as_verify_error(check: Any, *args: Any) -> Any:
    """Run a check that raises AnnotationError, as a VerifyException."""
    try:
        return check(*args)
    except AnnotationError as err:
        raise VerifyException(err.message) from None


def _parse_arguments(cls: type[AnnotationAttr], parser: AttrParser) -> dict[str, Any]:
    """The comma-separated arguments between the angle brackets, by parameter name."""
    schema = cls.schema()
    positional = [p for p in cls.PARAMS if p.positional]
    values: dict[str, Any] = {}
    while True:
        start = parser.pos
        key = _parse_optional_key(parser)
        if key is None:
            if not positional:
                parser.raise_error(f"expected a parameter name of @{cls.dsl_name}")
            param = positional.pop(0)
        elif key not in schema:
            parser.raise_error(f"@{cls.dsl_name} has no parameter '{key}'", start, parser.pos)
        else:
            param = schema[key]
            positional = [p for p in positional if p.name != key]
        if param.name in values:
            parser.raise_error(f"@{cls.dsl_name}: '{param.name}' is given twice", start, parser.pos)
        values[param.name] = parse_value(parser, param)
        if parser.parse_optional_punctuation(",") is None:
            return values


def _parse_optional_key(parser: AttrParser) -> str | None:
    """A ``name =`` prefix, if the next tokens are one (keyword arguments)."""
    token = parser._current_token  # two-token lookahead, which the parser API lacks
    if token.kind.name != "BARE_IDENT":
        return None
    rest = token.span.input.content[token.span.end :].lstrip()
    if not rest.startswith("=") or rest.startswith("=="):
        return None
    name = parser.parse_identifier()
    parser.parse_punctuation("=")
    return name


def _canonical_args(cls: type[AnnotationAttr], values: Mapping[str, Any]) -> dict[str, Attribute]:
    """Check values against the schema and the cross rules; keep the non-default ones."""
    schema = cls.schema()
    checked: dict[str, Any] = {}
    for key, value in values.items():
        if key not in schema:
            known = ", ".join(schema) or "none"
            raise AnnotationError(f"@{cls.dsl_name} has no parameter '{key}'", f"its parameters are: {known}")
        checked[key] = schema[key].check(cls.dsl_name, value)
    for p in cls.PARAMS:
        if p.required and p.name not in checked:
            raise AnnotationError(f"@{cls.dsl_name} needs '{p.name}'", _usage(cls))
    try:
        cls.check_values({p.name: p.default for p in cls.PARAMS} | checked)
    except AnnotationError as err:
        raise AnnotationError(err.message, err.hint or _usage(cls)) from None
    return {
        key: to_attr(schema[key], value)
        for key, value in checked.items()
        if schema[key].required or value != schema[key].default
    }


def _usage(cls: type[AnnotationAttr]) -> str:
    """A usage line for hints: ``usage: @memory(mode, priority=0, ...)``."""
    parts = []
    for p in cls.PARAMS:
        if p.required:
            parts.append(p.name if p.positional else f"{p.name}=...")
        else:
            parts.append(f"{p.name}={value_text(p, p.default) if p.default is not None else '...'}")
    return f"usage: @{cls.dsl_name}({', '.join(parts)})"


def _changed(cls: type[AnnotationAttr], values: Mapping[str, Any], among: Sequence[str]) -> list[str]:
    """Those of ``among`` whose value differs from its default."""
    schema = cls.schema()
    return [name for name in among if values[name] != schema[name].default]


def _only_for(cls: type[AnnotationAttr], values: Mapping[str, Any], selector: str,
              options: Mapping[str, Sequence[str]]) -> None:
    """Options that belong to other values of ``selector`` (an adapter type, a scaling strategy) are errors."""
    chosen = values[selector]
    allowed = set(options.get(chosen, ()))
    every = sorted({name for names in options.values() for name in names})
    stray = [name for name in _changed(cls, values, every) if name not in allowed]
    if stray:
        takes = ", ".join(sorted(allowed)) or "none of them"
        raise AnnotationError(f"@{cls.dsl_name}({chosen}) does not take {', '.join(stray)}", f"{chosen} takes {takes}")


# ----------------------------------------------------------------------------
# Constants of the spec
# ----------------------------------------------------------------------------

MEMORY_MODES = ("save", "recompute", "temporary", "pin", "offload", "stream")
# seed 002: always recompute; lora_only: only while adapters are trained (full fine-tuning saves); never
RECOMPUTE_POLICIES = ("always", "lora_only", "never")
OFFLOAD_MODES = ("offload", "stream")
PARAMETER_MEMORY_MODES = ("save", "pin", "offload", "stream")
CHECKPOINT_GRANULARITIES = ("full", "selective", "none")
LIFETIME_SCOPES = ("operation", "sublayer", "block", "layer", "global")
HOOK_POINTS = (
    "AfterEmbedding", "AfterQKVProjection", "AfterQKNorm", "BeforeAttention", "AfterAttention",
    "AfterAttnOutProjection", "BeforeResidualAdd", "AfterResidualAdd", "AfterMLPUpProjection",
    "AfterMLPActivation", "AfterMLPDownProjection", "AfterRouterProjection", "BeforeExpertCompute",
    "AfterExpertCompute", "BeforeLMHead", "AfterLMHead",
)
HOOK_MODES = ("observe", "modify", "replace")
ADAPTER_OPTIONS: dict[str, tuple[str, ...]] = {
    "lora": ("rank", "alpha", "dropout", "targets"),
    "ia3": ("targets",),
    "prefix": ("length", "hidden_dim"),
    "prompt": ("length",),
    "adapter": ("bottleneck_dim", "activation"),
}
PROBE_CAPTURES = ("stats", "histogram", "sample", "full", "grad_stats", "grad_full")
PRECISION_POLICIES: dict[str, tuple[str, str, str]] = {  # compute, accumulate, output
    "fp32": ("fp32", "fp32", "fp32"),
    "bf16": ("bf16", "fp32", "bf16"),
    "fp16": ("fp16", "fp32", "fp16"),
    "fp8_hybrid": ("fp8_e4m3", "fp32", "bf16"),
    "fp8_pure": ("fp8_e4m3", "fp32", "fp8_e4m3"),
    "fp4": ("fp4_e2m1", "fp32", "bf16"),
}
SCALING_STRATEGIES = ("per_tensor", "per_channel", "per_token", "per_block", "delayed", "dynamic")
SCALING_OPTIONS: dict[str, tuple[str, ...]] = {
    "delayed": ("history_len", "update_interval", "margin"),
    "per_block": ("block_size",),
    "dynamic": ("margin",),
}
FUSION_PATTERNS = tuple(SPEC_PATTERNS)  # spec 7.5.1's, for hints (modeldsl.dialects.fusion_patterns)
SHARD_STRATEGIES = ("column", "row", "replicated", "expert", "sequence", "batch", "head")
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send", "recv", "broadcast")
TRACE_LEVELS = ("ops", "tensors", "values")
GRADIENT_MODES = ("compute", "skip", "accumulate", "checkpoint")


# ----------------------------------------------------------------------------
# 7.2 Memory
# ----------------------------------------------------------------------------


@irdl_attr_definition
class MemoryAttr(AnnotationAttr):
    """``@memory(mode, priority=0, prefetch=true, async=true, policy=always)``: spec 7.2.1 (``policy``:
    seed 002's recompute policy)."""

    name = "mdsl.graph.memory"
    DSL_NAME = "memory"
    PARAMS = (
        enum("mode", MEMORY_MODES, positional=True),
        optional("priority", "int", 0, minimum=0),
        optional("prefetch", "bool", True),
        optional("async", "bool", True),
        enum("policy", RECOMPUTE_POLICIES, default="always"),
    )

    @classmethod
    def check_values(cls, values: dict[str, Any]) -> None:
        if values["policy"] != "always" and values["mode"] not in ("recompute", "temporary"):
            raise AnnotationError(f"@memory({values['mode']}) takes no recompute policy",
                                  "policy=lora_only or policy=never applies to recompute")
        stray = _changed(cls, values, ("priority", "prefetch"))
        if stray and values["mode"] not in OFFLOAD_MODES:
            raise AnnotationError(
                f"@memory({values['mode']}) does not take {', '.join(stray)}",
                "priority and prefetch apply to offload and stream",
            )


@irdl_attr_definition
class CheckpointAttr(AnnotationAttr):
    """``@checkpoint(granularity=full, preserve=[])``: spec 7.2.2."""

    name = "mdsl.graph.checkpoint"
    DSL_NAME = "checkpoint"
    PARAMS = (
        Param("granularity", "enum", "full", choices=CHECKPOINT_GRANULARITIES, positional=True),
        optional("preserve", "strs", []),
    )

    @classmethod
    def check_values(cls, values: dict[str, Any]) -> None:
        if values["granularity"] == "none" and values["preserve"]:
            raise AnnotationError("@checkpoint(granularity=none) disables checkpointing and takes no 'preserve' list")


@irdl_attr_definition
class LifetimeAttr(AnnotationAttr):
    """``@lifetime(scope=operation)`` or ``@lifetime(start=op, end=op)``: spec 7.2.3."""

    name = "mdsl.graph.lifetime"
    DSL_NAME = "lifetime"
    PARAMS = (
        Param("scope", "enum", "operation", choices=LIFETIME_SCOPES, positional=True),
        optional("start", "str"),
        optional("end", "str"),
    )

    @classmethod
    def check_values(cls, values: dict[str, Any]) -> None:
        if (values["start"] is None) != (values["end"] is None):
            raise AnnotationError("@lifetime needs both 'start' and 'end', or neither")
        if values["start"] is not None and values["scope"] != "operation":
            raise AnnotationError("@lifetime takes a 'scope' or 'start' and 'end', not both")


# ----------------------------------------------------------------------------
# 7.3 Hooks
# ----------------------------------------------------------------------------


@irdl_attr_definition
class HookAttr(AnnotationAttr):
    """``@hook(point, mode=observe, priority=0)``: spec 7.3.1 (any hook point name; the standard ones
    are ``HOOK_POINTS``)."""

    name = "mdsl.graph.hook"
    DSL_NAME = "hook"
    REPEATABLE = True
    PARAMS = (
        required("point", "name"),
        enum("mode", HOOK_MODES, "observe"),
        optional("priority", "int", 0, minimum=0),
    )


@irdl_attr_definition
class AdapterAttr(AnnotationAttr):
    """``@adapter(type, ...)`` with the options of its type (LoRA, IA3, prefix, prompt, bottleneck): spec 7.3.2."""

    name = "mdsl.graph.adapter"
    DSL_NAME = "adapter"
    REPEATABLE = True
    PARAMS = (
        enum("type", tuple(ADAPTER_OPTIONS), positional=True),
        optional("rank", "int", 16, minimum=1),
        optional("alpha", "float", 32.0, minimum=0.0, strict=True),
        optional("dropout", "float", 0.0, minimum=0.0),
        optional("targets", "strs", []),
        optional("length", "int", 10, minimum=1),
        optional("hidden_dim", "int", minimum=1),
        optional("bottleneck_dim", "int", 64, minimum=1),
        enum("activation", ("relu", "gelu", "silu"), "relu"),
    )

    @classmethod
    def check_values(cls, values: dict[str, Any]) -> None:
        if not 0.0 <= values["dropout"] < 1.0:
            raise AnnotationError(f"@adapter dropout must be in [0, 1), got {values['dropout']}")
        if len(set(values["targets"])) != len(values["targets"]):
            raise AnnotationError(f"@adapter targets repeat a name: {values['targets']}")
        _only_for(cls, values, "type", ADAPTER_OPTIONS)


@irdl_attr_definition
class ProbeAttr(AnnotationAttr):
    """``@probe(name, capture=stats, condition, frequency=1)``: spec 7.3.3."""

    name = "mdsl.graph.probe"
    DSL_NAME = "probe"
    REPEATABLE = True
    PARAMS = (
        required("name", "str"),
        enum("capture", PROBE_CAPTURES, "stats"),
        optional("condition", "str"),
        optional("frequency", "int", 1, minimum=1),
    )


# ----------------------------------------------------------------------------
# 7.4 Precision
# ----------------------------------------------------------------------------


@irdl_attr_definition
class DtypeAttr(AnnotationAttr):
    """``@dtype(type)``: spec 7.4.1, binding."""

    name = "mdsl.graph.dtype"
    DSL_NAME = "dtype"
    BINDING = True
    PARAMS = (required("type", "dtype"),)


@irdl_attr_definition
class PrecisionAttr(AnnotationAttr):
    """``@precision(compute, accumulate=fp32, output)`` or ``@precision(policy=name)``: spec 7.4.2."""

    name = "mdsl.graph.precision"
    DSL_NAME = "precision"
    PARAMS = (
        optional("compute", "dtype"),
        optional("accumulate", "dtype", "fp32"),
        optional("output", "dtype"),
        Param("policy", "enum", None, choices=tuple(PRECISION_POLICIES)),
    )

    @classmethod
    def check_values(cls, values: dict[str, Any]) -> None:
        explicit = _changed(cls, values, ("compute", "accumulate", "output"))
        if values["policy"] is not None and explicit:
            raise AnnotationError(
                f"@precision takes a 'policy' or explicit dtypes, not both (got policy and {', '.join(explicit)})"
            )
        accumulate = DType(values["accumulate"])
        if not accumulate.is_float or accumulate.bits < 16:
            raise AnnotationError(f"@precision accumulate must be a 16- or 32-bit float type, got {accumulate.value}")

    def resolved(self) -> tuple[str | None, str, str | None]:
        """(compute, accumulate, output): from the policy's row of the 7.4.2 table, or as given."""
        values = self.values
        if values["policy"] is not None:
            return PRECISION_POLICIES[values["policy"]]
        return values["compute"], values["accumulate"], values["output"]


@irdl_attr_definition
class ScalingAttr(AnnotationAttr):
    """``@scaling(strategy, history_len=16, update_interval=1, block_size=[32, 32], margin=0.0)``: spec 7.4.3."""

    name = "mdsl.graph.scaling"
    DSL_NAME = "scaling"
    PARAMS = (
        enum("strategy", SCALING_STRATEGIES, positional=True),
        optional("history_len", "int", 16, minimum=1),
        optional("update_interval", "int", 1, minimum=1),
        optional("block_size", "ints", [32, 32]),
        optional("margin", "float", 0.0, minimum=0.0),
    )

    @classmethod
    def check_values(cls, values: dict[str, Any]) -> None:
        block = values["block_size"]
        if len(block) != 2 or any(b <= 0 for b in block):
            raise AnnotationError(f"@scaling block_size must be two positive integers, got {block}")
        _only_for(cls, values, "strategy", SCALING_OPTIONS)


@irdl_attr_definition
class RecipeAttr(AnnotationAttr):
    """``@recipe(Name)``: the precision recipe of a whole model, spec 7.4.4."""

    name = "mdsl.graph.recipe"
    DSL_NAME = "recipe"
    PARAMS = (required("name", "name"),)


# ----------------------------------------------------------------------------
# 7.5 Fusion
# ----------------------------------------------------------------------------

_FUSE_PARAMS = (
    Param("pattern", "name", None, positional=True),
    optional("ops", "strs"),
    enum("scope", ("local", "global"), "local"),
)


def _check_fusion(cls: type[AnnotationAttr], values: Mapping[str, Any], needs_target: bool) -> None:
    """A pattern or an ops list, not both (neither: the compiler looks for fusions itself)."""
    if values["pattern"] is not None and values["ops"] is not None:
        raise AnnotationError(f"@{cls.dsl_name} takes a pattern name or an 'ops' list, not both")
    if values["ops"] is not None and len(values["ops"]) < 2:
        raise AnnotationError(f"@{cls.dsl_name} ops must name at least two operations, got {values['ops']}")
    if needs_target and values["pattern"] is None and values["ops"] is None:
        raise AnnotationError(f"@{cls.dsl_name} needs a pattern name or an 'ops' list",
                              f"common patterns: {', '.join(FUSION_PATTERNS)}")


@irdl_attr_definition
class FuseAttr(AnnotationAttr):
    """``@fuse(pattern)``, ``@fuse(ops=[...])`` or ``@fuse(scope=global)``: spec 7.5.1, advisory."""

    name = "mdsl.graph.fuse"
    DSL_NAME = "fuse"
    PARAMS = _FUSE_PARAMS

    @classmethod
    def check_values(cls, values: dict[str, Any]) -> None:
        _check_fusion(cls, values, needs_target=False)


@irdl_attr_definition
class FuseRequiredAttr(AnnotationAttr):
    """``@fuse_required(pattern)`` or ``@fuse_required(ops=[...])``: the mandatory @fuse of spec 7.5.1, binding."""

    name = "mdsl.graph.fuse_required"
    DSL_NAME = "fuse_required"
    BINDING = True
    PARAMS = _FUSE_PARAMS

    @classmethod
    def check_values(cls, values: dict[str, Any]) -> None:
        _check_fusion(cls, values, needs_target=True)


@irdl_attr_definition
class NofuseAttr(AnnotationAttr):
    """``@nofuse(reason)``: spec 7.5.2, binding."""

    name = "mdsl.graph.nofuse"
    DSL_NAME = "nofuse"
    BINDING = True
    PARAMS = (Param("reason", "str", None, positional=True),)


@irdl_attr_definition
class KernelAttr(AnnotationAttr):
    """``@kernel(name, autotune=true, workspace, fallback=true)``: spec 7.5.3."""

    name = "mdsl.graph.kernel"
    DSL_NAME = "kernel"
    PARAMS = (
        required("name", "str"),
        optional("autotune", "bool", True),
        optional("workspace", "int", minimum=0),
        optional("fallback", "bool", True),
    )


# ----------------------------------------------------------------------------
# 7.6 Sharding
# ----------------------------------------------------------------------------


@irdl_attr_definition
class ShardAttr(AnnotationAttr):
    """``@shard(strategy, tp_size, ep_size, pp_size, async_comm=true, reduce_scatter=true)``: spec 7.6.1."""

    name = "mdsl.graph.shard"
    DSL_NAME = "shard"
    PARAMS = (
        enum("strategy", SHARD_STRATEGIES, positional=True),
        optional("tp_size", "int", minimum=1),
        optional("ep_size", "int", minimum=1),
        optional("pp_size", "int", minimum=1),
        optional("async_comm", "bool", True),
        optional("reduce_scatter", "bool", True),
    )

    @classmethod
    def check_values(cls, values: dict[str, Any]) -> None:
        sizes = _changed(cls, values, ("tp_size", "ep_size", "pp_size"))
        if values["strategy"] == "replicated" and sizes:
            raise AnnotationError(f"@shard(replicated) keeps a full copy and takes no {', '.join(sizes)}")


# the dim of one layer's [out, in] tensor (or [out] bias) each tensor-parallel strategy divides
SHARD_DIMS = {"column": 0, "row": 1}


def shard_strategy(param: Operation) -> str | None:
    """The ``@shard`` strategy a parameter declaration declares (``column``, ``row``, ...), or None."""
    attr = find_annotation(param, ShardAttr)
    return attr.values["strategy"] if attr is not None else None


@irdl_attr_definition
class PartitionAttr(AnnotationAttr):
    """``@partition(stage, micro_batch=true, recompute=false)``: spec 7.6.2."""

    name = "mdsl.graph.partition"
    DSL_NAME = "partition"
    PARAMS = (
        required("stage", "int", minimum=0),
        optional("micro_batch", "bool", True),
        optional("recompute", "bool", False),
    )


@irdl_attr_definition
class CommAttr(AnnotationAttr):
    """``@comm(op, group="default", async=true, bucket_size)``: spec 7.6.3."""

    name = "mdsl.graph.comm"
    DSL_NAME = "comm"
    PARAMS = (
        enum("op", COLLECTIVE_OPS, positional=True),
        optional("group", "str", "default"),
        optional("async", "bool", True),
        optional("bucket_size", "int", minimum=1),
    )

    @classmethod
    def check_values(cls, values: dict[str, Any]) -> None:
        if not values["group"]:
            raise AnnotationError("@comm group must not be empty")


# ----------------------------------------------------------------------------
# 7.7 Debugging and profiling
# ----------------------------------------------------------------------------


@irdl_attr_definition
class AssertAttr(AnnotationAttr):
    """``@assert(condition, message, enabled=true)``: spec 7.7.1 (``@assert(!has_nan(out), "NaN in out")``;
    the message positional or ``message=``)."""

    name = "mdsl.graph.assert"
    DSL_NAME = "assert"
    REPEATABLE = True
    PARAMS = (required("condition", "str"), Param("message", "str", positional=True),
              optional("enabled", "bool", True))

    @classmethod
    def check_values(cls, values: dict[str, Any]) -> None:
        """The condition is a conjunction of the checks :mod:`modeldsl.dialects.assertions` reads."""
        try:
            parse_condition(values["condition"])
        except ConditionError as err:
            raise AnnotationError(err.message, err.hint) from None

    def checks(self) -> list[Check]:
        return parse_condition(self["condition"])


@irdl_attr_definition
class ProfileAttr(AnnotationAttr):
    """``@profile(name, memory=false, cuda_events=true, nvtx=true)``: spec 7.7.2."""

    name = "mdsl.graph.profile"
    DSL_NAME = "profile"
    PARAMS = (
        required("name", "str"),
        optional("memory", "bool", False),
        optional("cuda_events", "bool", True),
        optional("nvtx", "bool", True),
    )


@irdl_attr_definition
class TraceAttr(AnnotationAttr):
    """``@trace(level=ops)``: spec 7.7.3."""

    name = "mdsl.graph.trace"
    DSL_NAME = "trace"
    PARAMS = (Param("level", "enum", "ops", choices=TRACE_LEVELS, positional=True),)


# ----------------------------------------------------------------------------
# 7.8 Training
# ----------------------------------------------------------------------------


@irdl_attr_definition
class FrozenAttr(AnnotationAttr):
    """``@frozen``: spec 7.8.1, the parameter receives no gradient and no optimizer state."""

    name = "mdsl.graph.frozen"
    DSL_NAME = "frozen"


@irdl_attr_definition
class TrainableAttr(AnnotationAttr):
    """``@trainable(lr_scale=1.0, wd_scale=1.0, grad_clip)``: spec 7.8.2."""

    name = "mdsl.graph.trainable"
    DSL_NAME = "trainable"
    PARAMS = (
        optional("lr_scale", "float", 1.0, minimum=0.0),
        optional("wd_scale", "float", 1.0, minimum=0.0),
        optional("grad_clip", "float", minimum=0.0, strict=True),
    )


@irdl_attr_definition
class GradientAttr(AnnotationAttr):
    """``@gradient(mode=compute, scale=1.0, clip)``: spec 7.8.3 (the mode defaults to compute, as in
    ``@gradient(scale=0.1)``)."""

    name = "mdsl.graph.gradient"
    DSL_NAME = "gradient"
    PARAMS = (
        Param("mode", "enum", "compute", choices=GRADIENT_MODES, positional=True),
        optional("scale", "float", 1.0),
        optional("clip", "float", minimum=0.0, strict=True),
    )

    @classmethod
    def check_values(cls, values: dict[str, Any]) -> None:
        stray = _changed(cls, values, ("scale", "clip"))
        if values["mode"] == "skip" and stray:
            raise AnnotationError(f"@gradient(skip) computes no gradient and takes no {', '.join(stray)}")


# ----------------------------------------------------------------------------
# 5.11 Aliasing and ordering
# ----------------------------------------------------------------------------


@irdl_attr_definition
class AliasAttr(AnnotationAttr):
    """``@alias``: the result shares its input's buffer, spec 5.11.2."""

    name = "mdsl.graph.alias"
    DSL_NAME = "alias"


@irdl_attr_definition
class NoaliasAttr(AnnotationAttr):
    """``@noalias``: the result is an independent buffer, spec 5.11.2."""

    name = "mdsl.graph.noalias"
    DSL_NAME = "noalias"


@irdl_attr_definition
class BarrierAttr(AnnotationAttr):
    """``@barrier``: later statements execute after this one, spec 5.11.5."""

    name = "mdsl.graph.barrier"
    DSL_NAME = "barrier"


# ----------------------------------------------------------------------------
# The registry and the frontend constructor
# ----------------------------------------------------------------------------

ANNOTATIONS: tuple[type[AnnotationAttr], ...] = (
    MemoryAttr, CheckpointAttr, LifetimeAttr, HookAttr, AdapterAttr, ProbeAttr, DtypeAttr,
    PrecisionAttr, ScalingAttr, FuseAttr, NofuseAttr, KernelAttr, ShardAttr, PartitionAttr,
    CommAttr, AssertAttr, ProfileAttr, TraceAttr, FrozenAttr, TrainableAttr, GradientAttr, RecipeAttr,
    FuseRequiredAttr, AliasAttr, NoaliasAttr, BarrierAttr,
)
ANNOTATION_BY_NAME: dict[str, type[AnnotationAttr]] = {a.dsl_name: a for a in ANNOTATIONS}


def make_annotation(name: str, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None) -> AnnotationAttr:
    """The annotation ``@name(*args, **kwargs)`` of the DSL, validated against its schema.

    Positional arguments fill the positional parameters not given by keyword,
    in order. Raises :class:`AnnotationError` for an unknown annotation and
    for bad, missing or extra arguments.
    """
    cls = ANNOTATION_BY_NAME.get(name)
    if cls is None:
        raise AnnotationError(
            f"unknown annotation @{name}", f"known annotations: {', '.join(sorted(ANNOTATION_BY_NAME))}"
        )
    values: dict[str, Any] = dict(kwargs or {})
    positional = [p for p in cls.PARAMS if p.positional and p.name not in values]
    if len(args) > len(positional):
        taken = f"at most {len(positional)} positional argument(s)" if positional else "no positional arguments"
        raise AnnotationError(f"@{name} takes {taken}, got {len(args)}", _usage(cls))
    for param, value in zip(positional, args):
        values[param.name] = value
    return cls.of(**values)


# ----------------------------------------------------------------------------
# Annotations on ops
# ----------------------------------------------------------------------------

# Pairs that contradict each other on one target.
CONFLICTS: tuple[tuple[type[AnnotationAttr], type[AnnotationAttr]], ...] = (
    (FrozenAttr, TrainableAttr),
    (AliasAttr, NoaliasAttr),
    (FuseAttr, NofuseAttr),
    (FuseRequiredAttr, NofuseAttr),
)


def annotations_of(op: Operation) -> list[AnnotationAttr]:
    """The annotations an op (or a parameter declaration) carries, in order."""
    attr = op.attributes.get(ANNOTATIONS_ATTR_NAME)
    if not isinstance(attr, ArrayAttr):
        return []
    return [a for a in attr.data if isinstance(a, AnnotationAttr)]


def find_annotation(op: Operation, cls: type[AnnotationAttr]) -> AnnotationAttr | None:
    """The first annotation of the given class on an op, or None."""
    return next((a for a in annotations_of(op) if isinstance(a, cls)), None)


def is_frozen(param: Operation) -> bool:
    """Whether a parameter declaration is ``@frozen`` (no gradient, no optimizer state)."""
    return find_annotation(param, FrozenAttr) is not None


def check_annotation_set(annotations: Sequence[AnnotationAttr]) -> None:
    """Annotations on one target must not repeat (unless repeatable) or contradict; raises AnnotationError."""
    seen: set[type[AnnotationAttr]] = set()
    for annotation in annotations:
        kind = type(annotation)
        if kind in seen and not kind.REPEATABLE:
            raise AnnotationError(f"@{kind.dsl_name} is given twice on one target", "keep one of them")
        seen.add(kind)
    for first, second in CONFLICTS:
        if first in seen and second in seen:
            raise AnnotationError(f"@{first.dsl_name} and @{second.dsl_name} contradict each other", "keep one of them")
    _check_output_dtype(annotations)


def _check_output_dtype(annotations: Sequence[AnnotationAttr]) -> None:
    """@dtype and the output dtype of @precision must agree."""
    dtype = next((a["type"] for a in annotations if isinstance(a, DtypeAttr)), None)
    precision = next((a for a in annotations if isinstance(a, PrecisionAttr)), None)
    output = precision.resolved()[2] if precision is not None else None
    if dtype is not None and output is not None and dtype != output:
        raise AnnotationError(f"@dtype({dtype}) contradicts the @precision output dtype {output}")


def check_annotations(op: Operation) -> None:
    """The ``annotations`` attribute, when present, is a consistent array of annotations (for op verifiers)."""
    attr = op.attributes.get(ANNOTATIONS_ATTR_NAME)
    if attr is None:
        return
    if not isinstance(attr, ArrayAttr) or not all(isinstance(a, AnnotationAttr) for a in attr.data):
        raise VerifyException(f"'{ANNOTATIONS_ATTR_NAME}' must be an array of #mdsl.graph annotations")
    _as_verify_error(check_annotation_set, attr.data)


# ----------------------------------------------------------------------------
# Memory policy precedence (7.2.0)
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryPolicy:
    """The memory mode of a tensor and the rung of the ladder that decided it.

    ``source`` is one of ``annotation``, ``checkpoint_preserve``,
    ``checkpoint``, ``save_list``, ``recompute_list`` and ``default``.
    """

    mode: str
    source: str


def effective_memory_policy(
    tensor: str,
    *,
    annotations: Sequence[AnnotationAttr] = (),
    instance_checkpoint: CheckpointAttr | None = None,
    block_checkpoint: CheckpointAttr | None = None,
    save: Sequence[str] = (),
    recompute: Sequence[str] = (),
    needed_by_backward: bool = False,
    is_parameter: bool = False,
) -> MemoryPolicy:
    """Resolve a tensor's memory mode by the precedence ladder of spec 7.2.0, highest first.

    1. the tensor's own ``@memory`` annotation (in ``annotations``);
    2. the instance-level ``@checkpoint`` of the region holding the tensor,
       when its ``preserve`` list names it: save;
    3. the checkpoint of the region (the instance-level one, else the
       block-level one: the innermost decides): a tensor its ``preserve``
       names is saved; ``full`` recomputes every other tensor; ``selective``
       recomputes only tensors marked elsewhere, so it decides nothing more;
       ``none`` disables checkpointing for the region, an enclosing block's
       checkpoint included;
    4. the module's ``save:`` list; 5. its ``recompute:`` list;
    6. the default: tensors the backward needs are saved, the others are
       temporary.

    Parameters are not activations: checkpoints and the save:/recompute:
    lists do not apply to them, they are pinned unless ``@memory`` says
    otherwise, and they cannot be recomputed or temporary (AnnotationError).
    Names in ``save``, ``recompute`` and ``preserve`` may be wildcard
    patterns (``ln*_out``) as in the spec's tensor lists.
    """
    memory = next((a for a in annotations if isinstance(a, MemoryAttr)), None)
    if memory is not None:
        return _annotated_policy(tensor, memory["mode"], is_parameter)
    if is_parameter:
        return MemoryPolicy("pin", "default")
    if instance_checkpoint is not None and _named(tensor, instance_checkpoint["preserve"]):
        return MemoryPolicy("save", "checkpoint_preserve")
    region = instance_checkpoint if instance_checkpoint is not None else block_checkpoint
    decided = _checkpoint_mode(tensor, region)
    if decided is not None:
        return MemoryPolicy(decided, "checkpoint")
    if _named(tensor, save):
        return MemoryPolicy("save", "save_list")
    if _named(tensor, recompute):
        return MemoryPolicy("recompute", "recompute_list")
    return MemoryPolicy("save" if needed_by_backward else "temporary", "default")


def _annotated_policy(tensor: str, mode: str, is_parameter: bool) -> MemoryPolicy:
    """Rung 1: the @memory annotation, which a parameter may use only to save, pin, offload or stream."""
    if is_parameter and mode not in PARAMETER_MEMORY_MODES:
        raise AnnotationError(
            f"parameter '{tensor}' cannot be @memory({mode})",
            f"a parameter is {', '.join(PARAMETER_MEMORY_MODES)}",
        )
    return MemoryPolicy(mode, "annotation")


def _checkpoint_mode(tensor: str, checkpoint: CheckpointAttr | None) -> str | None:
    """Rung 3: what the region's checkpoint decides for a tensor, or None."""
    if checkpoint is None or checkpoint["granularity"] == "none":
        return None
    if _named(tensor, checkpoint["preserve"]):
        return "save"
    return "recompute" if checkpoint["granularity"] == "full" else None


def _named(tensor: str, patterns: Sequence[str]) -> bool:
    """Whether a tensor list (names or wildcard patterns) names the tensor."""
    return any(fnmatch.fnmatchcase(tensor, pattern) for pattern in patterns)
