"""Annotations of the Module DSL (spec 000 section 7) as typed ``mdsl.graph`` attributes.

One attribute class per annotation (``#mdsl.graph.memory<recompute>``,
``#mdsl.graph.shard<column, tp_size = 4>``, ``#mdsl.graph.frozen``), each
with a schema of typed parameters and the spec's defaults. Parameters equal
to their default are not stored, so printing is canonical and
``parse(print(a)) == a``. Ops and parameter declarations carry their
annotations in an ``annotations`` array attribute.

The frontend builds annotations with :func:`make_annotation` from the DSL's
positional and keyword arguments; a bad annotation raises
:class:`AnnotationError`, which the frontend reports as E008.
:func:`effective_memory_policy` applies the precedence ladder of 7.2.0.
"""

from __future__ import annotations

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

from modeldsl.dialects.dtypes import DTYPE_SPELLINGS

ANNOTATIONS_ATTR_NAME = "annotations"


class AnnotationError(Exception):
    """A malformed annotation; the frontend reports it as E008."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint


# ----------------------------------------------------------------------------
# Parameter schemas
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    """One parameter of an annotation.

    ``kind`` is one of: ``enum`` (a bare word from ``choices``), ``name`` (any
    bare word, e.g. a hook point), ``dtype``, ``int``, ``float``, ``bool``,
    ``str`` (a string literal), ``strs`` (a list of strings), ``ints`` (a list
    of integers). ``default`` None with ``required`` False means optional.
    ``positional`` parameters may be given without their name, in order.
    """

    name: str
    kind: str
    default: Any = None
    required: bool = False
    choices: tuple[str, ...] = ()
    positional: bool = False
    minimum: float | None = None

    def check(self, annotation: str, value: Any) -> Any:
        """Validate a Python value for this parameter and return it normalized."""
        where = f"@{annotation}({self.name}=...)"
        if self.kind in ("enum", "name", "dtype", "str"):
            if not isinstance(value, str):
                raise AnnotationError(f"{where} expects a {self.kind_text()}, got {value!r}")
            if self.kind == "enum" and value not in self.choices:
                raise AnnotationError(f"{where}: '{value}' is not one of {', '.join(self.choices)}")
            if self.kind == "dtype" and value not in DTYPE_SPELLINGS:
                raise AnnotationError(f"{where}: '{value}' is not a dtype ({', '.join(DTYPE_SPELLINGS)})")
            if self.kind == "name" and not value.isidentifier():
                raise AnnotationError(f"{where}: '{value}' is not a name")
            return value
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise AnnotationError(f"{where} expects true or false, got {value!r}")
            return value
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise AnnotationError(f"{where} expects an integer, got {value!r}")
            return self._check_minimum(where, value)
        if self.kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise AnnotationError(f"{where} expects a number, got {value!r}")
            return self._check_minimum(where, float(value))
        if self.kind in ("strs", "ints"):
            item = str if self.kind == "strs" else int
            if not isinstance(value, (list, tuple)) or not all(
                isinstance(v, item) and not isinstance(v, bool) for v in value
            ):
                raise AnnotationError(f"{where} expects a list of {'strings' if item is str else 'integers'}, got {value!r}")
            return list(value)
        raise AssertionError(f"unknown parameter kind {self.kind}")

    def _check_minimum(self, where: str, value: float) -> float:
        if self.minimum is not None and value < self.minimum:
            raise AnnotationError(f"{where} must be >= {self.minimum:g}, got {value}")
        return value

    def kind_text(self) -> str:
        return {"enum": "word", "name": "name", "dtype": "dtype", "str": "string"}.get(self.kind, self.kind)


def enum(name: str, choices: Sequence[str], default: str | None = None, positional: bool = False) -> Param:
    return Param(name, "enum", default, required=default is None, choices=tuple(choices), positional=positional)


def required(name: str, kind: str) -> Param:
    return Param(name, kind, required=True, positional=True)


def optional(name: str, kind: str, default: Any = None, minimum: float | None = None) -> Param:
    return Param(name, kind, default, minimum=minimum)


# ----------------------------------------------------------------------------
# Storage of values as builtin attributes, and their text form
# ----------------------------------------------------------------------------


def to_attr(param: Param, value: Any) -> Attribute:
    if param.kind in ("enum", "name", "dtype", "str"):
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
    if param.kind in ("enum", "name", "dtype"):
        return value
    if param.kind == "str":
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if param.kind == "bool":
        return "true" if value else "false"
    if param.kind == "float":
        return repr(float(value))
    if param.kind == "strs":
        return "[" + ", ".join(value_text(Param("s", "str"), v) for v in value) + "]"
    return "[" + ", ".join(str(v) for v in value) + "]" if param.kind == "ints" else str(value)


def parse_value(parser: AttrParser, param: Param) -> Any:
    if param.kind in ("enum", "name", "dtype"):
        return parser.parse_identifier(f" for '{param.name}'")
    if param.kind == "str":
        return parser.parse_str_literal(f" for '{param.name}'")
    if param.kind == "bool":
        return parser.parse_boolean(f" for '{param.name}'")
    if param.kind == "int":
        return parser.parse_integer(allow_boolean=False)
    if param.kind == "float":
        return float(parser.parse_number())
    item = parser.parse_str_literal if param.kind == "strs" else (lambda: parser.parse_integer(allow_boolean=False))
    return parser.parse_comma_separated_list(parser.Delimiter.SQUARE, item)


# ----------------------------------------------------------------------------
# The base attribute
# ----------------------------------------------------------------------------


class AnnotationAttr(ParametrizedAttribute):
    """Base of every annotation attribute: its non-default arguments in a dictionary."""

    DSL_NAME: ClassVar[str]
    PARAMS: ClassVar[tuple[Param, ...]] = ()

    args: DictionaryAttr

    @classmethod
    def schema(cls) -> dict[str, Param]:
        return {p.name: p for p in cls.PARAMS}

    @classmethod
    def of(cls, **values: Any) -> "AnnotationAttr":
        """Build from keyword values (validated; defaults dropped)."""
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
        schema = self.schema()
        for key, attr in self.args.data.items():
            if key not in schema:
                raise VerifyException(f"@{self.DSL_NAME} has no parameter '{key}'")
            try:
                value = schema[key].check(self.DSL_NAME, from_attr(schema[key], attr))
            except AnnotationError as err:
                raise VerifyException(err.message) from None
            if value == schema[key].default and not schema[key].required:
                raise VerifyException(f"@{self.DSL_NAME}: '{key}' equals its default and must be omitted")
        for p in self.PARAMS:
            if p.required and p.name not in self.args.data:
                raise VerifyException(f"@{self.DSL_NAME} needs '{p.name}'")
        try:
            self.check_values(self.values)
        except AnnotationError as err:
            raise VerifyException(err.message) from None

    @classmethod
    def check_values(cls, values: dict[str, Any]) -> None:
        """Rules across parameters; subclasses raise AnnotationError."""

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list[Attribute]:
        schema = cls.schema()
        values: dict[str, Any] = {}
        if parser.parse_optional_punctuation("<") is None:
            return [DictionaryAttr({})]
        positional = [p for p in cls.PARAMS if p.positional]
        first = True
        while first or parser.parse_optional_punctuation(",") is not None:
            start = parser.pos
            key = _parse_optional_key(parser)
            if key is None:
                if not positional:
                    parser.raise_error(f"expected a parameter name of @{cls.DSL_NAME}")
                param = positional.pop(0)
            else:
                if key not in schema:
                    parser.raise_error(f"@{cls.DSL_NAME} has no parameter '{key}'", start, parser.pos)
                param = schema[key]
                positional = [p for p in positional if p.name != key]
            values[param.name] = parse_value(parser, param)
            first = False
        parser.parse_punctuation(">")
        try:
            return [DictionaryAttr(_canonical_args(cls, values))]
        except AnnotationError as err:
            parser.raise_error(err.message)

    def print_parameters(self, printer: Printer) -> None:
        if not self.args.data:
            return
        pieces = []
        bare = True  # positional parameters print bare until one is left out
        for p in self.PARAMS:
            if p.name not in self.args.data:
                bare = bare and not p.positional
                continue
            text = value_text(p, from_attr(p, self.args.data[p.name]))
            pieces.append(text if p.positional and bare else f"{p.name} = {text}")
        printer.print_string("<" + ", ".join(pieces) + ">")


def _parse_optional_key(parser: AttrParser) -> str | None:
    """A ``name =`` prefix, if the next tokens are one (keyword arguments)."""
    token = parser._current_token  # noqa: SLF001 - two-token lookahead the parser API lacks
    if token.kind.name != "BARE_IDENT":
        return None
    rest = token.span.input.content[token.span.end :].lstrip()
    if not rest.startswith("="):
        return None
    name = parser.parse_identifier()
    parser.parse_punctuation("=")
    return name


def _canonical_args(cls: type[AnnotationAttr], values: Mapping[str, Any]) -> dict[str, Attribute]:
    schema = cls.schema()
    stored: dict[str, Attribute] = {}
    for key, value in values.items():
        if key not in schema:
            known = ", ".join(schema) or "none"
            raise AnnotationError(f"@{cls.DSL_NAME} has no parameter '{key}'", f"its parameters are: {known}")
        param = schema[key]
        value = param.check(cls.DSL_NAME, value)
        if param.required or value != param.default:
            stored[key] = to_attr(param, value)
    for p in cls.PARAMS:
        if p.required and p.name not in stored:
            raise AnnotationError(f"@{cls.DSL_NAME} needs '{p.name}'", _usage(cls))
    full = {p.name: p.default for p in cls.PARAMS} | {k: schema[k].check(cls.DSL_NAME, v) for k, v in values.items()}
    cls.check_values(full)
    return stored


def _usage(cls: type[AnnotationAttr]) -> str:
    parts = []
    for p in cls.PARAMS:
        if p.required:
            parts.append(p.name if p.positional else f"{p.name}=...")
        else:
            parts.append(f"{p.name}={value_text(p, p.default) if p.default is not None else '...'}")
    return f"usage: @{cls.DSL_NAME}({', '.join(parts)})"


# ----------------------------------------------------------------------------
# The annotations of section 7
# ----------------------------------------------------------------------------

MEMORY_MODES = ("save", "recompute", "temporary", "pin", "offload", "stream")
HOOK_POINTS = (
    "AfterEmbedding", "AfterQKVProjection", "AfterQKNorm", "BeforeAttention", "AfterAttention",
    "AfterAttnOutProjection", "BeforeResidualAdd", "AfterResidualAdd", "AfterMLPUpProjection",
    "AfterMLPActivation", "AfterMLPDownProjection", "AfterRouterProjection", "BeforeExpertCompute",
    "AfterExpertCompute", "BeforeLMHead", "AfterLMHead",
)
PRECISION_POLICIES = ("fp32", "bf16", "fp16", "fp8_hybrid", "fp8_pure", "fp4")
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send", "recv", "broadcast")


@irdl_attr_definition
class MemoryAttr(AnnotationAttr):
    """``@memory(mode, priority, prefetch, async)``: 7.2.1."""

    name = "mdsl.graph.memory"
    DSL_NAME = "memory"
    PARAMS = (
        enum("mode", MEMORY_MODES, positional=True),
        optional("priority", "int", 0),
        optional("prefetch", "bool", True),
        optional("async", "bool", True),
    )


@irdl_attr_definition
class CheckpointAttr(AnnotationAttr):
    """``@checkpoint(granularity, preserve)``: 7.2.2."""

    name = "mdsl.graph.checkpoint"
    DSL_NAME = "checkpoint"
    PARAMS = (
        Param("granularity", "enum", "full", choices=("full", "selective", "none"), positional=True),
        optional("preserve", "strs", []),
    )


@irdl_attr_definition
class LifetimeAttr(AnnotationAttr):
    """``@lifetime(scope, start, end)``: 7.2.3."""

    name = "mdsl.graph.lifetime"
    DSL_NAME = "lifetime"
    PARAMS = (
        Param("scope", "enum", "operation", choices=("operation", "sublayer", "block", "layer", "global"), positional=True),
        optional("start", "str"),
        optional("end", "str"),
    )

    @classmethod
    def check_values(cls, values: dict[str, Any]) -> None:
        if (values["start"] is None) != (values["end"] is None):
            raise AnnotationError("@lifetime needs both 'start' and 'end', or neither")


@irdl_attr_definition
class HookAttr(AnnotationAttr):
    """``@hook(point, mode, priority)``: 7.3.1 (any hook point name; the standard ones are ``HOOK_POINTS``)."""

    name = "mdsl.graph.hook"
    DSL_NAME = "hook"
    PARAMS = (
        required("point", "name"),
        enum("mode", ("observe", "modify", "replace"), "observe"),
        optional("priority", "int", 0),
    )


@irdl_attr_definition
class AdapterAttr(AnnotationAttr):
    """``@adapter(type, ...)``: 7.3.2 (LoRA, IA3, prefix, prompt, bottleneck)."""

    name = "mdsl.graph.adapter"
    DSL_NAME = "adapter"
    PARAMS = (
        enum("type", ("lora", "ia3", "prefix", "prompt", "adapter"), positional=True),
        optional("rank", "int", 16, minimum=1),
        optional("alpha", "float", 32.0),
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


@irdl_attr_definition
class ProbeAttr(AnnotationAttr):
    """``@probe(name, capture, condition, frequency)``: 7.3.3."""

    name = "mdsl.graph.probe"
    DSL_NAME = "probe"
    PARAMS = (
        required("name", "str"),
        enum("capture", ("stats", "histogram", "sample", "full", "grad_stats", "grad_full"), "stats"),
        optional("condition", "str"),
        optional("frequency", "int", 1, minimum=1),
    )


@irdl_attr_definition
class DtypeAttr(AnnotationAttr):
    """``@dtype(type)``: 7.4.1."""

    name = "mdsl.graph.dtype"
    DSL_NAME = "dtype"
    PARAMS = (required("type", "dtype"),)


@irdl_attr_definition
class PrecisionAttr(AnnotationAttr):
    """``@precision(compute, accumulate, output, policy)``: 7.4.2."""

    name = "mdsl.graph.precision"
    DSL_NAME = "precision"
    PARAMS = (
        optional("compute", "dtype"),
        optional("accumulate", "dtype", "fp32"),
        optional("output", "dtype"),
        Param("policy", "enum", None, choices=PRECISION_POLICIES),
    )

    @classmethod
    def check_values(cls, values: dict[str, Any]) -> None:
        if values["policy"] is not None and (values["compute"] or values["output"]):
            raise AnnotationError("@precision takes a 'policy' or explicit dtypes, not both")


@irdl_attr_definition
class ScalingAttr(AnnotationAttr):
    """``@scaling(strategy, history_len, update_interval, block_size, margin)``: 7.4.3."""

    name = "mdsl.graph.scaling"
    DSL_NAME = "scaling"
    PARAMS = (
        enum("strategy", ("per_tensor", "per_channel", "per_token", "per_block", "delayed", "dynamic"), positional=True),
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


@irdl_attr_definition
class FuseAttr(AnnotationAttr):
    """``@fuse(pattern, ops, scope)``: 7.5.1."""

    name = "mdsl.graph.fuse"
    DSL_NAME = "fuse"
    PARAMS = (
        Param("pattern", "name", None, positional=True),
        optional("ops", "strs"),
        enum("scope", ("local", "global"), "local"),
    )

    @classmethod
    def check_values(cls, values: dict[str, Any]) -> None:
        if values["pattern"] is None and not values["ops"]:
            raise AnnotationError("@fuse needs a pattern name or an 'ops' list")


@irdl_attr_definition
class NofuseAttr(AnnotationAttr):
    """``@nofuse(reason)``: 7.5.2."""

    name = "mdsl.graph.nofuse"
    DSL_NAME = "nofuse"
    PARAMS = (Param("reason", "str", None, positional=True),)


@irdl_attr_definition
class KernelAttr(AnnotationAttr):
    """``@kernel(name, autotune, workspace, fallback)``: 7.5.3."""

    name = "mdsl.graph.kernel"
    DSL_NAME = "kernel"
    PARAMS = (
        required("name", "str"),
        optional("autotune", "bool", True),
        optional("workspace", "int", minimum=0),
        optional("fallback", "bool", True),
    )


@irdl_attr_definition
class ShardAttr(AnnotationAttr):
    """``@shard(strategy, tp_size, ep_size, pp_size, async_comm, reduce_scatter)``: 7.6.1."""

    name = "mdsl.graph.shard"
    DSL_NAME = "shard"
    PARAMS = (
        enum("strategy", ("column", "row", "replicated", "expert", "sequence", "batch", "head"), positional=True),
        optional("tp_size", "int", minimum=1),
        optional("ep_size", "int", minimum=1),
        optional("pp_size", "int", minimum=1),
        optional("async_comm", "bool", True),
        optional("reduce_scatter", "bool", True),
    )


@irdl_attr_definition
class PartitionAttr(AnnotationAttr):
    """``@partition(stage, micro_batch, recompute)``: 7.6.2."""

    name = "mdsl.graph.partition"
    DSL_NAME = "partition"
    PARAMS = (
        Param("stage", "int", None, required=True, positional=True, minimum=0),
        optional("micro_batch", "bool", True),
        optional("recompute", "bool", False),
    )


@irdl_attr_definition
class CommAttr(AnnotationAttr):
    """``@comm(op, group, async, bucket_size)``: 7.6.3."""

    name = "mdsl.graph.comm"
    DSL_NAME = "comm"
    PARAMS = (
        enum("op", COLLECTIVE_OPS, positional=True),
        optional("group", "str", "default"),
        optional("async", "bool", True),
        optional("bucket_size", "int", minimum=1),
    )


@irdl_attr_definition
class AssertAttr(AnnotationAttr):
    """``@assert(condition, message, enabled)``: 7.7.1."""

    name = "mdsl.graph.assert"
    DSL_NAME = "assert"
    PARAMS = (required("condition", "str"), optional("message", "str"), optional("enabled", "bool", True))


@irdl_attr_definition
class ProfileAttr(AnnotationAttr):
    """``@profile(name, memory, cuda_events, nvtx)``: 7.7.2."""

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
    """``@trace(level)``: 7.7.3."""

    name = "mdsl.graph.trace"
    DSL_NAME = "trace"
    PARAMS = (Param("level", "enum", "ops", choices=("ops", "tensors", "values"), positional=True),)


@irdl_attr_definition
class FrozenAttr(AnnotationAttr):
    """``@frozen``: 7.8.1, the parameter receives no gradient."""

    name = "mdsl.graph.frozen"
    DSL_NAME = "frozen"


@irdl_attr_definition
class TrainableAttr(AnnotationAttr):
    """``@trainable(lr_scale, wd_scale, grad_clip)``: 7.8.2."""

    name = "mdsl.graph.trainable"
    DSL_NAME = "trainable"
    PARAMS = (
        optional("lr_scale", "float", 1.0, minimum=0.0),
        optional("wd_scale", "float", 1.0, minimum=0.0),
        optional("grad_clip", "float", minimum=0.0),
    )


@irdl_attr_definition
class GradientAttr(AnnotationAttr):
    """``@gradient(mode, scale, clip)``: 7.8.3."""

    name = "mdsl.graph.gradient"
    DSL_NAME = "gradient"
    PARAMS = (
        enum("mode", ("compute", "skip", "accumulate", "checkpoint"), "compute", positional=True),
        optional("scale", "float", 1.0),
        optional("clip", "float", minimum=0.0),
    )


@irdl_attr_definition
class RecipeAttr(AnnotationAttr):
    """``@recipe(Name)``: 7.4.4, a precision recipe for the whole model."""

    name = "mdsl.graph.recipe"
    DSL_NAME = "recipe"
    PARAMS = (required("name", "name"),)


ANNOTATIONS: tuple[type[AnnotationAttr], ...] = (
    MemoryAttr, CheckpointAttr, LifetimeAttr, HookAttr, AdapterAttr, ProbeAttr, DtypeAttr,
    PrecisionAttr, ScalingAttr, FuseAttr, NofuseAttr, KernelAttr, ShardAttr, PartitionAttr,
    CommAttr, AssertAttr, ProfileAttr, TraceAttr, FrozenAttr, TrainableAttr, GradientAttr, RecipeAttr,
)
ANNOTATION_BY_NAME: dict[str, type[AnnotationAttr]] = {a.DSL_NAME: a for a in ANNOTATIONS}


def make_annotation(name: str, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None) -> AnnotationAttr:
    """The annotation ``@name(*args, **kwargs)`` of the DSL, validated against its schema."""
    cls = ANNOTATION_BY_NAME.get(name)
    if cls is None:
        raise AnnotationError(f"unknown annotation @{name}", f"known annotations: {', '.join(sorted(ANNOTATION_BY_NAME))}")
    values: dict[str, Any] = dict(kwargs or {})
    positional = [p for p in cls.PARAMS if p.positional and p.name not in values]
    if len(args) > len(positional):
        raise AnnotationError(f"@{name} takes at most {len(positional)} positional argument(s), got {len(args)}", _usage(cls))
    for param, value in zip(positional, args):
        values[param.name] = value
    return cls.of(**values)


def annotations_of(op: Operation) -> list[AnnotationAttr]:
    attr = op.attributes.get(ANNOTATIONS_ATTR_NAME)
    if not isinstance(attr, ArrayAttr):
        return []
    return [a for a in attr.data if isinstance(a, AnnotationAttr)]


def check_annotations(op: Operation) -> None:
    """The ``annotations`` attribute, when present, is an array of annotations."""
    attr = op.attributes.get(ANNOTATIONS_ATTR_NAME)
    if attr is None:
        return
    if not isinstance(attr, ArrayAttr) or not all(isinstance(a, AnnotationAttr) for a in attr.data):
        raise VerifyException(f"'{ANNOTATIONS_ATTR_NAME}' must be an array of #mdsl.graph annotations")


def find_annotation(op: Operation, cls: type[AnnotationAttr]) -> AnnotationAttr | None:
    return next((a for a in annotations_of(op) if isinstance(a, cls)), None)


# ----------------------------------------------------------------------------
# Memory policy precedence (7.2.0)
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryPolicy:
    """The memory mode of a tensor and the rung of the ladder that decided it."""

    mode: str
    source: str  # "annotation" | "checkpoint_preserve" | "checkpoint" | "save_list" | "recompute_list" | "default"


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
    """Resolve a tensor's memory mode by the precedence ladder of spec 7.2.0.

    1. its own ``@memory`` annotation;
    2. an instance-level ``@checkpoint(preserve=[...])`` naming it: save;
    3. a ``@checkpoint`` on the instance or the block: ``full`` recomputes,
       ``selective`` and ``none`` decide nothing;
    4. the module's ``save:`` list; 5. its ``recompute:`` list;
    6. the default: parameters pin, tensors the backward needs are saved,
       everything else is temporary.
    """
    for annotation in annotations:
        if isinstance(annotation, MemoryAttr):
            return MemoryPolicy(annotation["mode"], "annotation")
    if instance_checkpoint is not None and tensor in instance_checkpoint["preserve"]:
        return MemoryPolicy("save", "checkpoint_preserve")
    for checkpoint in (instance_checkpoint, block_checkpoint):
        if checkpoint is not None and checkpoint["granularity"] == "full" and not is_parameter:
            return MemoryPolicy("recompute", "checkpoint")
    if tensor in save:
        return MemoryPolicy("save", "save_list")
    if tensor in recompute:
        return MemoryPolicy("recompute", "recompute_list")
    if is_parameter:
        return MemoryPolicy("pin", "default")
    return MemoryPolicy("save" if needed_by_backward else "temporary", "default")
