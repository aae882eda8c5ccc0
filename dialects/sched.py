"""The ``mdsl.sched`` dialect: the imperative schedule a backend executes.

A ``program`` owns one arena per memory class with its size in bytes:
``params`` (the weights), ``activations``, ``workspace`` (kernel scratch),
``grads`` (one gradient per trainable parameter, accumulated over
micro-batches until the optimizer step reads and zeroes it), ``optimizer``
(the optimizer's state: AdamW moments) and ``external`` (inputs, outputs and
state buffers such as KV caches). Buffers are typed views
(``!mdsl.sched.buffer<[2, 64], bf16>``) placed at an offset in an arena, or
aliases of another buffer at a byte offset. The body is an ordered list of
launches of registry kernels, GEMMs, attention calls, memsets and copies,
layer loops (one block body run per layer, with per-layer slices of stacked
buffers), recompute segments, collectives and stream synchronization.
Ops write their outputs in place: an output is an operand, not a result.

Later issues (lowering, memory planning, CUDA) refine these ops; every op
already has a verifier and a custom form that round-trips.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from xdsl.dialects.builtin import (
    DenseArrayBase,
    FloatAttr,
    IndexType,
    IntegerAttr,
    StringAttr,
    SymbolNameConstraint,
    SymbolRefAttr,
    UnitAttr,
    f64,
    i64,
)
from xdsl.ir import (
    Attribute,
    Block,
    Dialect,
    Operation,
    ParametrizedAttribute,
    Region,
    SSAValue,
    TypeAttribute,
)
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    attr_def,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_attr_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.parser import AttrParser, Parser
from xdsl.printer import Printer
from xdsl.traits import (
    HasParent,
    IsolatedFromAbove,
    NoTerminator,
    SymbolOpInterface,
    SymbolTable,
)
from xdsl.utils.exceptions import VerifyException

from modeldsl.dialects.assertions import BOUNDED, RUNTIME_CHECKS, Check
from modeldsl.dialects.dtypes import DType, parse_dtype_spelling, verify_dtype_spelling

ARENAS: tuple[str, ...] = ("params", "activations", "workspace", "grads", "optimizer", "external")
ATTENTION_LAYOUTS: tuple[str, ...] = ("bhtd", "bthd")
STORED_DTYPES: tuple[DType, ...] = (DType.FP8_E4M3, DType.FP8_E5M2)  # what a scaled GEMM operand holds
COLLECTIVES: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send", "recv", "broadcast")
REDUCE_OPS: tuple[str, ...] = ("sum", "max", "min", "avg")


def _parse_i64(parser: AttrParser) -> int:
    """An integer literal that fits the i64 it is stored in (a located parse error otherwise)."""
    start = parser.pos
    value = parser.parse_integer(allow_boolean=False)
    if not -(2**63) <= value < 2**63:
        parser.raise_error("integer literal does not fit in 64 bits", start)
    return value


# ----------------------------------------------------------------------------
# The buffer type
# ----------------------------------------------------------------------------


@irdl_attr_definition
class BufferType(ParametrizedAttribute, TypeAttribute):
    """A typed view of bytes in an arena: ``!mdsl.sched.buffer<[2, 64], bf16>``."""

    name = "mdsl.sched.buffer"

    shape_attr: DenseArrayBase
    dtype_name: StringAttr

    def __init__(self, shape: Sequence[int], dtype: DType | str):
        spelling = dtype.value if isinstance(dtype, DType) else dtype
        super().__init__(DenseArrayBase.from_list(i64, list(shape)), StringAttr(spelling))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.shape_attr.get_values())

    @property
    def dtype(self) -> DType:
        return DType(self.dtype_name.data)

    @property
    def numel(self) -> int:
        total = 1
        for d in self.shape:
            total *= d
        return total

    @property
    def nbytes(self) -> int:
        return self.dtype.byte_size(self.numel)

    def verify(self) -> None:
        verify_dtype_spelling(self.dtype_name.data)
        if any(d < 0 for d in self.shape):
            raise VerifyException(f"buffer dimensions must be non-negative, got {list(self.shape)}")

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list[Attribute]:
        with parser.in_angle_brackets():
            dims = parser.parse_comma_separated_list(
                parser.Delimiter.SQUARE, lambda: _parse_i64(parser)
            )
            parser.parse_punctuation(",")
            spelling = parse_dtype_spelling(parser)
        return [DenseArrayBase.from_list(i64, dims), StringAttr(spelling)]

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<[{', '.join(map(str, self.shape))}], {self.dtype_name.data}>")


def buffer_type(value: SSAValue) -> BufferType:
    t = value.type
    if not isinstance(t, BufferType):
        raise VerifyException(f"expected a !mdsl.sched.buffer, got {t}")
    return t


# ----------------------------------------------------------------------------
# Shared helpers
# ----------------------------------------------------------------------------


def _check_choice(what: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise VerifyException(f"{what} must be one of {', '.join(allowed)}, got '{value}'")


def _optional(value: SSAValue | None) -> list[SSAValue]:
    """The operand list of an optional operand, for builders."""
    return [] if value is None else [value]


def _non_default(**attrs: Attribute | None) -> dict[str, Attribute]:
    """The attributes a builder sets: those not left at their default (None)."""
    return {name: attr for name, attr in attrs.items() if attr is not None}


def _stream_attr(stream: str | None) -> SymbolRefAttr | None:
    return None if stream is None else SymbolRefAttr(stream)


def _enclosing_program(op: Operation) -> ProgramOp | None:
    parent = op.parent_op()
    while parent is not None and not isinstance(parent, ProgramOp):
        parent = parent.parent_op()
    return parent


def check_stream(op: Operation) -> None:
    """An op's optional ``stream`` attribute must name a stream of its program."""
    stream = op.attributes.get("stream")
    if stream is None:
        return
    if not isinstance(stream, SymbolRefAttr):
        raise VerifyException("stream must be a symbol reference like @comm")
    program = _enclosing_program(op)
    if program is None or not isinstance(SymbolTable.lookup_symbol(program, stream), StreamOp):
        raise VerifyException(f"stream {stream} is not declared in the program")


# the attributes of a kernel choice (``@kernel``, spec 7.5.3, recorded by mdsl-lower-to-sched):
# ``implementation`` names one of the primitive's registry implementations, ``fallback = false``
# makes it binding (no other kernel may run the op), ``workspace_bytes`` sizes its workspace
KERNEL_CHOICE_ATTRIBUTES: tuple[str, ...] = ("implementation", "fallback", "workspace_bytes")

# a launch attribute: the kernel keys what it draws (dropout's mask) with the layers of the loops around
# it, outermost first, which an unrolled walk knows (the executors pass them as its ``layers``)
KEYED_BY_LAYER = "keyed_by_layer"
# launch attributes that are not kernel parameters
LAUNCH_ATTRIBUTES = {"grid", "block", "inplace", "accumulate", "stream", "scratch", "absent", KEYED_BY_LAYER,
                     *KERNEL_CHOICE_ATTRIBUTES}


def check_kernel_choice(op: Operation, primitive: str | None) -> None:
    """The kernel choice attributes of an op that runs ``primitive`` (None: an op that takes none)."""
    given = [name for name in KERNEL_CHOICE_ATTRIBUTES if name in op.attributes]
    if not given:
        return
    if primitive is None:
        raise VerifyException(f"{op.name} runs no primitive and takes no kernel choice ({', '.join(given)})")
    implementation = op.attributes.get("implementation")
    if not isinstance(implementation, StringAttr):
        raise VerifyException(f"a kernel choice ({', '.join(given)}) needs an 'implementation' string")
    from modeldsl.kernels.registry import implementations

    if implementation.data not in implementations(primitive):
        raise VerifyException(f"implementation '{implementation.data}' is no kernel of {primitive} "
                              f"(its kernels: {', '.join(implementations(primitive))})")
    fallback = op.attributes.get("fallback")
    if fallback is not None and not (isinstance(fallback, IntegerAttr) and fallback.type.width.data == 1):
        raise VerifyException("fallback must be a boolean (true or false)")
    workspace = op.attributes.get("workspace_bytes")
    if workspace is not None and not (isinstance(workspace, IntegerAttr) and workspace.value.data >= 0):
        raise VerifyException("workspace_bytes must be a non-negative integer")


def kernel_choice_attributes(implementation: str, fallback: bool = True,
                             workspace: int | None = None) -> dict[str, Attribute]:
    """The attributes recording a kernel choice (defaults left unset)."""
    return _non_default(implementation=StringAttr(implementation),
                        fallback=None if fallback else IntegerAttr.from_bool(False),
                        workspace_bytes=None if workspace is None else IntegerAttr(workspace, i64))


class SchedOp(IRDLOperation):
    """Base of the body ops: checks the optional ``stream`` attribute and a kernel choice
    (on the ops that run a primitive, ``PRIMITIVE``)."""

    PRIMITIVE: ClassVar[str | None] = None

    def verify_(self) -> None:
        check_stream(self)
        check_kernel_choice(self, self.primitive)
        self.verify_op()

    @property
    def primitive(self) -> str | None:
        """The primitive the op runs, whose implementations a kernel choice names."""
        return self.PRIMITIVE

    def verify_op(self) -> None:
        pass


def _parse_keyword_in(parser: Parser, allowed: Sequence[str], what: str) -> str:
    start = parser.pos
    word = parser.parse_optional_identifier()
    if word not in allowed:
        parser.raise_error(f"expected {what} ({', '.join(allowed)})", start, parser.pos)
    return word


def _parse_body(parser: Parser) -> Region:
    """A single-block region without block arguments; ``{}`` gives one empty block."""
    body = parser.parse_region()
    if not body.blocks:
        body.add_block(Block())
    return body


# ----------------------------------------------------------------------------
# Program, buffers
# ----------------------------------------------------------------------------


@irdl_op_definition
class ProgramOp(IRDLOperation):
    """A schedule with one arena per memory class:

    ``mdsl.sched.program @train arenas(params = 1024, activations = 4096, workspace = 0, grads = 1024,
    optimizer = 2048, external = 256) { ... }``
    """

    name = "mdsl.sched.program"

    sym_name = prop_def(SymbolNameConstraint())
    arena_sizes = prop_def(DenseArrayBase)
    body = region_def("single_block")

    traits = traits_def(SymbolOpInterface(), SymbolTable(), NoTerminator(), IsolatedFromAbove())

    def __init__(self, name: str, arenas: dict[str, int] | None = None, body: Region | None = None):
        sizes = [int((arenas or {}).get(a, 0)) for a in ARENAS]
        super().__init__(
            properties={"sym_name": StringAttr(name), "arena_sizes": DenseArrayBase.from_list(i64, sizes)},
            regions=[body if body is not None else Region(Block())],
        )

    @property
    def arenas(self) -> dict[str, int]:
        return dict(zip(ARENAS, self.arena_sizes.get_values()))

    def verify_(self) -> None:
        sizes = list(self.arena_sizes.get_values())
        if len(sizes) != len(ARENAS):
            raise VerifyException(f"expected {len(ARENAS)} arena sizes ({', '.join(ARENAS)}), got {len(sizes)}")
        for arena, size in self.arenas.items():
            if size < 0:
                raise VerifyException(f"arena {arena} has negative size {size}")
        for op in self.body.walk():
            if isinstance(op, BufferOp) and op.offset is not None and op.alias_of is None:
                end = op.offset.value.data + op.bytes.value.data
                limit = self.arenas[op.arena.data]
                if end > limit:
                    raise VerifyException(
                        f"buffer at offset {op.offset.value.data} with {op.bytes.value.data} bytes "
                        f"overflows arena {op.arena.data} ({limit} bytes)"
                    )

    @classmethod
    def parse(cls, parser: Parser) -> ProgramOp:
        name = parser.parse_symbol_name().data
        parser.parse_keyword("arenas")
        sizes: dict[str, int] = {}

        def parse_entry() -> None:
            arena = _parse_keyword_in(parser, ARENAS, "an arena")
            parser.parse_punctuation("=")
            sizes[arena] = _parse_i64(parser)

        parser.parse_comma_separated_list(parser.Delimiter.PAREN, parse_entry)
        attrs = parser.parse_optional_attr_dict_with_keyword()
        op = ProgramOp(name, sizes, _parse_body(parser))
        if attrs is not None:
            op.attributes |= attrs.data
        return op

    def print(self, printer: Printer) -> None:
        printer.print_string(f" @{self.sym_name.data} arenas(")
        printer.print_string(", ".join(f"{a} = {s}" for a, s in self.arenas.items()))
        printer.print_string(")")
        printer.print_op_attributes(self.attributes, print_keyword=True)
        printer.print_string(" ")
        printer.print_region(self.body, print_entry_block_args=False, print_empty_block=False)


@irdl_op_definition
class BufferOp(IRDLOperation):
    """A buffer: an arena, an offset (absent until planned) and a byte size.

    ``%b = mdsl.sched.buffer activations offset 256 bytes 4096 : !mdsl.sched.buffer<[2, 1024], bf16>``;
    an alias views another buffer at a byte offset:
    ``%v = mdsl.sched.buffer activations offset 2048 bytes 2048 alias_of %b : ...``.
    """

    name = "mdsl.sched.buffer"

    alias_of = opt_operand_def(BufferType)
    result = result_def(BufferType)
    arena = prop_def(StringAttr)
    offset = opt_prop_def(IntegerAttr)
    bytes = prop_def(IntegerAttr)

    traits = traits_def(HasParent(ProgramOp))

    def __init__(
        self,
        arena: str,
        result_type: BufferType,
        offset: int | None = None,
        nbytes: int | None = None,
        alias_of: SSAValue | None = None,
    ):
        props: dict[str, Attribute] = {
            "arena": StringAttr(arena),
            "bytes": IntegerAttr(result_type.nbytes if nbytes is None else nbytes, i64),
        }
        if offset is not None:
            props["offset"] = IntegerAttr(offset, i64)
        super().__init__(
            operands=[[alias_of] if alias_of is not None else []],
            result_types=[result_type],
            properties=props,
        )

    def verify_(self) -> None:
        _check_choice("arena", self.arena.data, ARENAS)
        t = buffer_type(self.result)
        size = self.bytes.value.data
        if size < t.nbytes:
            raise VerifyException(f"{size} bytes cannot hold {list(t.shape)} x {t.dtype.value} ({t.nbytes} bytes)")
        if self.offset is not None and self.offset.value.data < 0:
            raise VerifyException(f"offset must be non-negative, got {self.offset.value.data}")
        if self.alias_of is not None:
            self._verify_alias()

    def _verify_alias(self) -> None:
        base = self.alias_of.owner
        if not isinstance(base, BufferOp):
            raise VerifyException("alias_of must be a buffer")
        if base.arena.data != self.arena.data:
            raise VerifyException(f"alias in arena {self.arena.data} of a buffer in arena {base.arena.data}")
        if self.offset is None:
            raise VerifyException("an alias needs its byte offset into the aliased buffer")
        end = self.offset.value.data + self.bytes.value.data
        if end > base.bytes.value.data:
            raise VerifyException(
                f"alias [{self.offset.value.data}, {end}) exceeds the {base.bytes.value.data} bytes"
                " of the aliased buffer"
            )

    @classmethod
    def parse(cls, parser: Parser) -> BufferOp:
        arena = _parse_keyword_in(parser, ARENAS, "an arena")
        offset = _parse_i64(parser) if parser.parse_optional_keyword("offset") else None
        parser.parse_keyword("bytes")
        nbytes = _parse_i64(parser)
        alias = None
        if parser.parse_optional_keyword("alias_of"):
            alias = parser.parse_unresolved_operand()
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        result_type = parser.parse_type()
        alias_value = None
        if alias is not None:
            base_type = parser.parse_type() if parser.parse_optional_keyword("from") else result_type
            alias_value = parser.resolve_operand(alias, base_type)
        op = BufferOp(arena, result_type, offset, nbytes, alias_value)
        op.attributes |= attrs
        return op

    def print(self, printer: Printer) -> None:
        printer.print_string(f" {self.arena.data}")
        if self.offset is not None:
            printer.print_string(f" offset {self.offset.value.data}")
        printer.print_string(f" bytes {self.bytes.value.data}")
        if self.alias_of is not None:
            printer.print_string(" alias_of ")
            printer.print_operand(self.alias_of)
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_attribute(self.result.type)
        if self.alias_of is not None and self.alias_of.type != self.result.type:
            printer.print_string(" from ")
            printer.print_attribute(self.alias_of.type)


# ----------------------------------------------------------------------------
# Work: kernel launches, GEMMs, attention, memset, copy
# ----------------------------------------------------------------------------


@irdl_op_definition
class LaunchOp(SchedOp):
    """A launch of a registry kernel that reads ``inputs`` and writes ``outputs``:

    ``mdsl.sched.launch "rmsnorm_fwd"(%x, %w) -> (%y, %rstd) {eps = 1.0e-05 : f64} : (...) -> (...)``

    Optional ``grid`` and ``block`` give the launch configuration; ``inplace``
    allows an output to be one of the inputs; ``accumulate`` adds the results
    into the outputs instead of overwriting them (for kernels that accumulate
    natively, the kernel registry's ``accumulates``: a gradient straight into
    its ``grads`` buffer). ``absent`` lists the primitive's optional input slots
    that are empty where a later optional one is given (``mamba_conv1d`` with a
    state and no bias), so the operands map onto the slots.
    """

    name = "mdsl.sched.launch"

    kernel = prop_def(StringAttr)
    inputs = var_operand_def(BufferType)
    outputs = var_operand_def(BufferType)
    grid = opt_attr_def(DenseArrayBase)
    block = opt_attr_def(DenseArrayBase)
    inplace = opt_attr_def(UnitAttr)
    accumulate = opt_attr_def(UnitAttr)

    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    assembly_format = (
        "$kernel `(` $inputs `)` `->` `(` $outputs `)` attr-dict "
        "`:` `(` type($inputs) `)` `->` `(` type($outputs) `)`"
    )

    def __init__(
        self,
        kernel: str,
        inputs: Sequence[SSAValue],
        outputs: Sequence[SSAValue],
        attributes: dict[str, Attribute] | None = None,
        *,
        grid: Sequence[int] | None = None,
        block: Sequence[int] | None = None,
        inplace: bool = False,
        accumulate: bool = False,
        stream: str | None = None,
    ):
        attrs = _non_default(
            grid=None if grid is None else DenseArrayBase.from_list(i64, list(grid)),
            block=None if block is None else DenseArrayBase.from_list(i64, list(block)),
            inplace=UnitAttr() if inplace else None,
            accumulate=UnitAttr() if accumulate else None,
            stream=_stream_attr(stream),
        )
        super().__init__(
            operands=[inputs, outputs],
            properties={"kernel": StringAttr(kernel)},
            attributes=attrs | (attributes or {}),
        )

    @property
    def primitive(self) -> str | None:
        return self.kernel.data

    @property
    def absent_slots(self) -> tuple[int, ...]:
        attr = self.attributes.get("absent")
        return tuple(attr.get_values()) if isinstance(attr, DenseArrayBase) else ()

    def verify_op(self) -> None:
        if not self.kernel.data:
            raise VerifyException("kernel name must not be empty")
        if not self.outputs:
            raise VerifyException("a launch writes at least one output")
        if self.inplace is None:
            shared = set(self.inputs) & set(self.outputs)
            if shared:
                raise VerifyException("an output is also an input; mark the launch 'inplace' if the kernel allows it")
        for what, dims in (("grid", self.grid), ("block", self.block)):
            if dims is not None:
                values = list(dims.get_values())
                if not 1 <= len(values) <= 3 or any(v <= 0 for v in values):
                    raise VerifyException(f"{what} must have 1 to 3 positive dimensions, got {values}")


def _gemm_dims(a: BufferType, b: BufferType, transa: bool, transb: bool) -> tuple[int, int, int, int]:
    (ar, ac), (br, bc) = a.shape[-2:], b.shape[-2:]
    m, ka = (ac, ar) if transa else (ar, ac)
    kb, n = (bc, br) if transb else (br, bc)
    return m, ka, kb, n


@dataclass(frozen=True)
class Epilogue:
    """What a GEMM epilogue does with the optional ``bias`` and ``aux`` operands.

    ``bias``: None (no bias operand), "read" (a bias of N values added to every
    row of C), "write_n" (writes N column sums) or "write_m" (writes M row sums).
    ``aux``: None, "write" (stores the pre-activation, shaped like C) or "read"
    (reads it back for the activation gradient).
    """

    bias: str | None = None
    aux: str | None = None


EPILOGUES: dict[str, Epilogue] = {
    "none": Epilogue(),
    "bias": Epilogue(bias="read"),
    "relu": Epilogue(),
    "relu_bias": Epilogue(bias="read"),
    "gelu": Epilogue(),
    "gelu_bias": Epilogue(bias="read"),
    # Forward GELU that saves its input for the backward ``dgelu``.
    "gelu_aux": Epilogue(aux="write"),
    "gelu_aux_bias": Epilogue(bias="read", aux="write"),
    # C = (op(A) @ op(B)) * gelu'(aux); ``dgelu_bgrad`` also writes the column sums of C.
    "dgelu": Epilogue(aux="read"),
    "dgelu_bgrad": Epilogue(bias="write_n", aux="read"),
    # Bias gradients: row sums of op(A) (M values) or column sums of op(B) (N values).
    "bgrada": Epilogue(bias="write_m"),
    "bgradb": Epilogue(bias="write_n"),
}


@irdl_op_definition
class GemmOp(SchedOp):
    """``C = alpha * op(A) @ op(B) + beta * C`` (+ epilogue), through cuBLASLt on the GPU.

    ``mdsl.sched.gemm %x, %w bias %b -> %y {transb = true, epilogue = "gelu_bias"} : ...``

    The last two dims of each buffer are the matrix, row-major; leading dims
    are a batch (B may have none: it broadcasts), so the batch count is the
    product of C's leading dims. ``transa``/``transb`` transpose A and B;
    ``epilogue`` (see ``EPILOGUES``) fuses a bias, an activation, an
    activation gradient through the saved ``aux`` buffer, or a bias gradient.
    ``scale %s`` says that B holds values stored in fp8 and ``%s`` (fp32, B's
    shape without its last dim) one scale per row of B: the GEMM multiplies by
    ``B * s[..., None]`` (``dequantize``'s values), widening it a tile at a time
    instead of holding it (``mdsl.sched.gemm %x, %q scale %s -> %y {transb = true}``).
    """

    name = "mdsl.sched.gemm"
    PRIMITIVE: ClassVar[str] = "matmul"

    a = operand_def(BufferType)
    b = operand_def(BufferType)
    scale_b = opt_operand_def(BufferType)
    bias = opt_operand_def(BufferType)
    aux = opt_operand_def(BufferType)
    c = operand_def(BufferType)
    transa = attr_def(IntegerAttr, default_value=IntegerAttr.from_bool(False))
    transb = attr_def(IntegerAttr, default_value=IntegerAttr.from_bool(False))
    alpha = attr_def(FloatAttr, default_value=FloatAttr(1.0, f64))
    beta = attr_def(FloatAttr, default_value=FloatAttr(0.0, f64))
    epilogue = attr_def(StringAttr, default_value=StringAttr("none"))

    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    assembly_format = (
        "$a `,` $b (`scale` $scale_b^)? (`bias` $bias^)? (`aux` $aux^)? `->` $c attr-dict "
        "`:` type($a) `,` type($b) (`scale` type($scale_b)^)? (`bias` type($bias)^)? (`aux` type($aux)^)? "
        "`->` type($c)"
    )

    def __init__(
        self,
        a: SSAValue,
        b: SSAValue,
        c: SSAValue,
        bias: SSAValue | None = None,
        attributes: dict[str, Attribute] | None = None,
        *,
        aux: SSAValue | None = None,
        transa: bool = False,
        transb: bool = False,
        alpha: float = 1.0,
        beta: float = 0.0,
        epilogue: str = "none",
        stream: str | None = None,
        scale_b: SSAValue | None = None,
    ):
        attrs = _non_default(
            transa=IntegerAttr.from_bool(True) if transa else None,
            transb=IntegerAttr.from_bool(True) if transb else None,
            alpha=FloatAttr(alpha, f64) if alpha != 1.0 else None,
            beta=FloatAttr(beta, f64) if beta != 0.0 else None,
            epilogue=StringAttr(epilogue) if epilogue != "none" else None,
            stream=_stream_attr(stream),
        )
        super().__init__(operands=[a, b, _optional(scale_b), _optional(bias), _optional(aux), c],
                         attributes=attrs | (attributes or {}))

    def verify_op(self) -> None:
        _check_choice("epilogue", self.epilogue.data, tuple(EPILOGUES))
        a, b, c = buffer_type(self.a), buffer_type(self.b), buffer_type(self.c)
        for what, t in (("A", a), ("B", b), ("C", c)):
            if len(t.shape) < 2:
                raise VerifyException(f"{what} must have at least 2 dims, got {list(t.shape)}")
        m, ka, kb, n = _gemm_dims(a, b, bool(self.transa.value.data), bool(self.transb.value.data))
        if ka != kb:
            raise VerifyException(f"inner dimensions differ: op(A) is [{m}, {ka}], op(B) is [{kb}, {n}]")
        if c.shape[-2:] != (m, n):
            raise VerifyException(f"C must be [{m}, {n}] in its last two dims, got {list(c.shape)}")
        batch_a, batch_c = a.shape[:-2], c.shape[:-2]
        if batch_a != batch_c or (len(b.shape) > 2 and b.shape[:-2] != batch_a):
            raise VerifyException(f"batch dims differ: A {list(batch_a)}, B {list(b.shape[:-2])}, C {list(batch_c)}")
        self._verify_epilogue_operands(m, n, c)
        if self.scale_b is not None:
            self._verify_scale(b, buffer_type(self.scale_b))

    @staticmethod
    def _verify_scale(b: BufferType, scale: BufferType) -> None:
        if b.dtype not in STORED_DTYPES:
            raise VerifyException(f"a scaled B holds fp8 values ({', '.join(STORED_DTYPES)}), got {b.dtype.value}")
        if scale.dtype != DType.FP32 or scale.shape != b.shape[:-1]:
            raise VerifyException(f"the scale of B is fp32 {list(b.shape[:-1])} (one per row of B), got "
                                  f"{scale.dtype.value} {list(scale.shape)}")

    def _verify_epilogue_operands(self, m: int, n: int, c: BufferType) -> None:
        name = self.epilogue.data
        rule = EPILOGUES[name]
        for what, role, operand in (("bias", rule.bias, self.bias), ("aux", rule.aux, self.aux)):
            if (role is None) != (operand is None):
                raise VerifyException(f"epilogue '{name}' {'takes no' if role is None else 'needs a'} {what} operand")
        if self.bias is not None:
            expected = m if rule.bias == "write_m" else n
            if buffer_type(self.bias).numel != expected:
                raise VerifyException(
                    f"bias of epilogue '{name}' has {buffer_type(self.bias).numel} elements, expected {expected}"
                )
        if self.aux is not None and buffer_type(self.aux).shape != c.shape:
            raise VerifyException(
                f"aux must have the shape of C {list(c.shape)}, got {list(buffer_type(self.aux).shape)}"
            )


def _attention_dims(t: BufferType, layout: str) -> tuple[int, int, int, int]:
    """(batch, heads, tokens, head_dim) of a 4-d buffer in ``layout``."""
    if len(t.shape) != 4:
        raise VerifyException(f"attention buffers are 4-d ({layout}), got {list(t.shape)}")
    b, x, y, d = t.shape
    return (b, x, y, d) if layout == "bhtd" else (b, y, x, d)


def _verify_attention(op: Operation, q_v: SSAValue, k_v: SSAValue, v_v: SSAValue, lse_v: SSAValue) -> None:
    layout = op.attributes["layout"].data
    _check_choice("layout", layout, ATTENTION_LAYOUTS)
    bq, hq, tq, dq = _attention_dims(buffer_type(q_v), layout)
    k, v = buffer_type(k_v), buffer_type(v_v)
    bk, hkv, tk, dk = _attention_dims(k, layout)
    if k.shape != v.shape:
        raise VerifyException(f"k and v differ: {list(k.shape)} vs {list(v.shape)}")
    if bq != bk or dq != dk:
        raise VerifyException(
            f"q [{bq}, {hq}, {tq}, {dq}] and k [{bk}, {hkv}, {tk}, {dk}] disagree on batch or head dim"
        )
    if hkv == 0 or hq % hkv:
        raise VerifyException(f"query heads ({hq}) must be a multiple of kv heads ({hkv})")
    if tq > tk:
        raise VerifyException(f"more queries ({tq}) than keys ({tk})")
    lse = buffer_type(lse_v)
    if lse.shape != (bq, hq, tq) or lse.dtype is not DType.FP32:
        raise VerifyException(f"lse must be [{bq}, {hq}, {tq}] fp32, got {list(lse.shape)} {lse.dtype.value}")
    window = op.attributes["window"].value.data
    if window < 0:
        raise VerifyException(f"window must be >= 0 (0 means none), got {window}")
    scale = op.attributes.get("scale")
    if isinstance(scale, FloatAttr) and not scale.value.data > 0:
        raise VerifyException(f"scale must be positive, got {scale.value.data}")
    softcap = op.attributes.get("softcap")
    if isinstance(softcap, FloatAttr) and not softcap.value.data > 0:
        raise VerifyException(f"softcap must be positive (absent: none), got {softcap.value.data}")
    segments = getattr(op, "segments", None)
    if segments is not None:
        ids = buffer_type(segments)
        if ids.shape != (bk, tk) or ids.dtype not in (DType.INT32, DType.INT64):
            raise VerifyException(f"segments must be [{bk}, {tk}] int32 or int64 (the keys' example ids), got "
                                  f"{list(ids.shape)} {ids.dtype.value}")


class AttentionAttrs:
    """The attributes shared by ``attention`` and ``attention_backward``."""

    causal = attr_def(IntegerAttr, default_value=IntegerAttr.from_bool(True))
    window = attr_def(IntegerAttr, default_value=IntegerAttr(0, i64))
    scale = opt_attr_def(FloatAttr)
    layout = attr_def(StringAttr, default_value=StringAttr("bhtd"))
    softcap = opt_attr_def(FloatAttr)  # c > 0: scores c * tanh(s / c) after the scale (absent: none)

    @staticmethod
    def build(
        causal: bool = True, window: int = 0, scale: float | None = None, layout: str = "bhtd",
        stream: str | None = None, softcap: float = 0.0,
    ) -> dict[str, Attribute]:
        """The attributes of a builder call, leaving defaults unset."""
        return _non_default(
            causal=None if causal else IntegerAttr.from_bool(False),
            window=IntegerAttr(window, i64) if window else None,
            scale=None if scale is None else FloatAttr(scale, f64),
            layout=None if layout == "bhtd" else StringAttr(layout),
            stream=_stream_attr(stream),
            softcap=FloatAttr(softcap, f64) if softcap else None,
        )


@irdl_op_definition
class AttentionOp(SchedOp):
    """Fused attention ``(q, k, v, segments?) -> (out, lse)``: causal, GQA, sliding window (``window`` > 0).

    ``mdsl.sched.attention %q, %k, %v -> %o, %lse {window = 8 : i64} : ...``; buffers
    are ``[B, H, T, D]`` (``layout = "bhtd"``, the default) or ``[B, T, H, D]``
    (``"bthd"``); ``lse`` is ``[B, Hq, Tq]`` fp32 in both; ``scale`` defaults
    to ``1/sqrt(D)``. ``segments %ids`` (``[B, Tk]`` int32 or int64, after the values): packed rows,
    a query sees only the keys of its own example (``mdsl.graph.flash_attention``'s segments).
    """

    name = "mdsl.sched.attention"
    PRIMITIVE: ClassVar[str] = "flash_attention"

    q = operand_def(BufferType)
    k = operand_def(BufferType)
    v = operand_def(BufferType)
    segments = opt_operand_def(BufferType)
    out = operand_def(BufferType)
    lse = operand_def(BufferType)
    causal = AttentionAttrs.causal
    window = AttentionAttrs.window
    scale = AttentionAttrs.scale
    layout = AttentionAttrs.layout
    softcap = AttentionAttrs.softcap

    assembly_format = (
        "$q `,` $k `,` $v (`segments` $segments^)? `->` $out `,` $lse attr-dict "
        "`:` type($q) `,` type($k) `,` type($v) (`segments` type($segments)^)? `->` type($out) `,` type($lse)"
    )

    def __init__(
        self, q: SSAValue, k: SSAValue, v: SSAValue, out: SSAValue, lse: SSAValue, segments: SSAValue | None = None,
        **attrs: bool | float | str | None
    ):
        """``attrs``: causal, window, scale, layout, stream, softcap (see ``AttentionAttrs.build``)."""
        super().__init__(operands=[q, k, v, [] if segments is None else [segments], out, lse],
                         attributes=AttentionAttrs.build(**attrs))

    def verify_op(self) -> None:
        _verify_attention(self, self.q, self.k, self.v, self.lse)
        if buffer_type(self.out).shape != buffer_type(self.q).shape:
            raise VerifyException("out must have the shape of q")


@irdl_op_definition
class AttentionBackwardOp(SchedOp):
    """Attention backward ``(q, k, v, out, d_out, lse, segments?) -> (d_q, d_k, d_v)``, attributes and
    segments as ``attention``.

    ``mdsl.sched.attention_backward %q, %k, %v, %o, %do, %lse -> %dq, %dk, %dv : ...``
    """

    name = "mdsl.sched.attention_backward"
    PRIMITIVE: ClassVar[str] = "flash_attention_backward"

    q = operand_def(BufferType)
    k = operand_def(BufferType)
    v = operand_def(BufferType)
    out = operand_def(BufferType)
    d_out = operand_def(BufferType)
    lse = operand_def(BufferType)
    segments = opt_operand_def(BufferType)
    d_q = operand_def(BufferType)
    d_k = operand_def(BufferType)
    d_v = operand_def(BufferType)
    causal = AttentionAttrs.causal
    window = AttentionAttrs.window
    scale = AttentionAttrs.scale
    layout = AttentionAttrs.layout
    softcap = AttentionAttrs.softcap

    assembly_format = (
        "$q `,` $k `,` $v `,` $out `,` $d_out `,` $lse (`segments` $segments^)? `->` $d_q `,` $d_k `,` $d_v attr-dict "
        "`:` type($q) `,` type($k) `,` type($v) `,` type($out) `,` type($d_out) `,` type($lse) "
        "(`segments` type($segments)^)? `->` type($d_q) `,` type($d_k) `,` type($d_v)"
    )

    def __init__(
        self,
        q: SSAValue,
        k: SSAValue,
        v: SSAValue,
        out: SSAValue,
        d_out: SSAValue,
        lse: SSAValue,
        d_q: SSAValue,
        d_k: SSAValue,
        d_v: SSAValue,
        segments: SSAValue | None = None,
        **attrs: bool | float | str | None,
    ):
        """``attrs``: causal, window, scale, layout, stream, softcap (see ``AttentionAttrs.build``)."""
        super().__init__(operands=[q, k, v, out, d_out, lse, [] if segments is None else [segments], d_q, d_k, d_v],
                         attributes=AttentionAttrs.build(**attrs))

    def verify_op(self) -> None:
        _verify_attention(self, self.q, self.k, self.v, self.lse)
        for what, grad, like in (("d_q", self.d_q, self.q), ("d_k", self.d_k, self.k), ("d_v", self.d_v, self.v),
                                 ("d_out", self.d_out, self.q), ("out", self.out, self.q)):
            if buffer_type(grad).shape != buffer_type(like).shape:
                raise VerifyException(f"{what} must have the shape {list(buffer_type(like).shape)}")


@irdl_op_definition
class MemsetOp(SchedOp):
    """Fills a buffer with one value (default 0.0):

    ``mdsl.sched.memset %b {value = 1.0 : f64} : !mdsl.sched.buffer<[128], bf16>``
    """

    name = "mdsl.sched.memset"

    target = operand_def(BufferType)
    value = attr_def(FloatAttr, default_value=FloatAttr(0.0, f64))

    assembly_format = "$target attr-dict `:` type($target)"

    def __init__(self, target: SSAValue, value: float = 0.0, *, stream: str | None = None):
        attrs = _non_default(value=FloatAttr(value, f64) if value != 0.0 else None, stream=_stream_attr(stream))
        super().__init__(operands=[target], attributes=attrs)


@irdl_op_definition
class AssertOp(SchedOp):
    """A runtime check of ``@assert`` (spec 7.7.1) on a buffer the op before it wrote:

    ``mdsl.sched.assert "no_nan"(%h) {message = "NaN in h", tensor = "h"} : !mdsl.sched.buffer<[2, 64], bf16>``

    ``check`` is one of :data:`~modeldsl.dialects.assertions.RUNTIME_CHECKS` (``ge``/``gt``/``le``/``lt``
    with a ``bound``: every element compared with it); ``tensor`` names the checked tensor and
    ``message`` is the annotation's; ``condition`` (the annotation's condition) and ``at`` (its
    source location) are optional. An executor that finds the check false stops the run with an
    error naming the tensor, the layer (inside a layer loop) and the message (E046). A program
    without ``@assert`` has none: it costs nothing."""

    name = "mdsl.sched.assert"

    value = operand_def(BufferType)
    check = prop_def(StringAttr)
    message = attr_def(StringAttr)
    tensor = attr_def(StringAttr)
    bound = opt_attr_def(FloatAttr)

    assembly_format = "$check `(` $value `)` attr-dict `:` type($value)"

    def __init__(self, check: str, value: SSAValue, tensor: str, message: str, bound: float | None = None,
                 condition: str | None = None, at: str | None = None):
        attrs = _non_default(message=StringAttr(message), tensor=StringAttr(tensor),
                             bound=FloatAttr(float(bound), f64) if bound is not None else None,
                             condition=StringAttr(condition) if condition else None,
                             at=StringAttr(at) if at else None)
        super().__init__(operands=[value], properties={"check": StringAttr(check)}, attributes=attrs)

    def verify_op(self) -> None:
        kind = self.check.data
        _check_choice("check", kind, tuple(RUNTIME_CHECKS))
        if (kind in BOUNDED) != (self.bound is not None):
            raise VerifyException(f"check '{kind}' {'needs a' if kind in BOUNDED else 'takes no'} bound")
        if self.bound is not None and not math.isfinite(self.bound.value.data):
            raise VerifyException(f"the bound must be finite, got {self.bound.value.data}")
        if not buffer_type(self.value).dtype.is_float:
            raise VerifyException(f"an assertion checks a float buffer, not {buffer_type(self.value).dtype.value}")
        if not self.tensor.data:
            raise VerifyException("the checked tensor must be named")
        for name in ("condition", "at"):
            if name in self.attributes and not isinstance(self.attributes[name], StringAttr):
                raise VerifyException(f"'{name}' must be a string")

    def checks(self):
        """The check as :class:`~modeldsl.dialects.assertions.Check`."""
        return Check(self.check.data, self.tensor.data, self.bound.value.data if self.bound is not None else None)


@irdl_op_definition
class CopyOp(SchedOp):
    """Copies ``src`` into ``dst``: all of it (equal byte sizes), or the leading
    ``bytes`` bytes of each.

    ``mdsl.sched.copy %x -> %y : !x -> !y``, ``mdsl.sched.copy %x -> %y {bytes = 512 : i64} : ...``
    """

    name = "mdsl.sched.copy"

    src = operand_def(BufferType)
    dst = operand_def(BufferType)
    nbytes = opt_attr_def(IntegerAttr, attr_name="bytes")

    assembly_format = "$src `->` $dst attr-dict `:` type($src) `->` type($dst)"

    def __init__(self, src: SSAValue, dst: SSAValue, *, nbytes: int | None = None, stream: str | None = None):
        attrs = _non_default(
            bytes=None if nbytes is None else IntegerAttr(nbytes, i64), stream=_stream_attr(stream)
        )
        super().__init__(operands=[src, dst], attributes=attrs)

    def verify_op(self) -> None:
        src, dst = buffer_type(self.src), buffer_type(self.dst)
        if self.nbytes is None:
            if src.nbytes != dst.nbytes:
                raise VerifyException(
                    f"copy between buffers of {src.nbytes} and {dst.nbytes} bytes needs an explicit 'bytes'"
                )
        elif not 0 < self.nbytes.value.data <= min(src.nbytes, dst.nbytes):
            raise VerifyException(
                f"copy of {self.nbytes.value.data} bytes between buffers of {src.nbytes} and {dst.nbytes} bytes"
            )
        if self.src == self.dst:
            raise VerifyException("copy of a buffer onto itself")


# ----------------------------------------------------------------------------
# Structure: layer loops, per-layer views, recompute segments
# ----------------------------------------------------------------------------


@irdl_op_definition
class LayerLoopOp(SchedOp):
    """Runs its body once per layer: ``mdsl.sched.layer_loop %l = 0 to 28 { ... }``.

    ``reverse`` runs the layers from last to first (backward).
    """

    name = "mdsl.sched.layer_loop"

    lower = prop_def(IntegerAttr)
    upper = prop_def(IntegerAttr)
    reverse = opt_prop_def(UnitAttr)
    body = region_def("single_block")

    traits = traits_def(NoTerminator())

    def __init__(self, lower: int, upper: int, body: Region | None = None, reverse: bool = False):
        props: dict[str, Attribute] = {"lower": IntegerAttr(lower, i64), "upper": IntegerAttr(upper, i64)}
        if reverse:
            props["reverse"] = UnitAttr()
        super().__init__(
            properties=props,
            regions=[body if body is not None else Region(Block(arg_types=[IndexType()]))],
        )

    @property
    def index(self) -> SSAValue:
        return self.body.block.args[0]

    def verify_op(self) -> None:
        args = self.body.block.args
        if len(args) != 1 or not isinstance(args[0].type, IndexType):
            raise VerifyException("the body takes one index argument, the layer")
        if not 0 <= self.lower.value.data <= self.upper.value.data:
            raise VerifyException(
                f"layer range {self.lower.value.data} to {self.upper.value.data} needs 0 <= lower <= upper"
            )

    @classmethod
    def parse(cls, parser: Parser) -> LayerLoopOp:
        arg = parser.parse_argument(expect_type=False)
        parser.parse_punctuation("=")
        lower = _parse_i64(parser)
        parser.parse_keyword("to")
        upper = _parse_i64(parser)
        reverse = parser.parse_optional_keyword("reverse") is not None
        attrs = parser.parse_optional_attr_dict_with_keyword()
        body = parser.parse_region([arg.resolve(IndexType())])
        op = LayerLoopOp(lower, upper, body, reverse)
        if attrs is not None:
            op.attributes |= attrs.data
        return op

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.index)
        printer.print_string(f" = {self.lower.value.data} to {self.upper.value.data}")
        if self.reverse is not None:
            printer.print_string(" reverse")
        printer.print_op_attributes(self.attributes, print_keyword=True)
        printer.print_string(" ")
        printer.print_region(self.body, print_entry_block_args=False, print_empty_block=False)


@irdl_op_definition
class LayerViewOp(IRDLOperation):
    """The slice of layer ``%l`` of a stacked buffer (leading dim = layers); with
    ``rows = array<i64: start, count>`` only those rows of the layer's slice:

    ``%w = mdsl.sched.layer_view %stacked[%l] {rows = array<i64: 0, 48>} : !mdsl.sched.buffer<[2, 96, 32], bf16>
    -> !mdsl.sched.buffer<[48, 32], bf16>``
    """

    name = "mdsl.sched.layer_view"

    stacked = operand_def(BufferType)
    layer = operand_def(IndexType)
    result = result_def(BufferType)
    rows = opt_attr_def(DenseArrayBase)

    assembly_format = "$stacked `[` $layer `]` attr-dict `:` type($stacked) `->` type($result)"

    def __init__(self, stacked: SSAValue, layer: SSAValue, rows: tuple[int, int] | None = None):
        t = buffer_type(stacked)
        shape = t.shape[1:] if rows is None else (rows[1], *t.shape[2:])
        attrs = {} if rows is None else {"rows": DenseArrayBase.from_list(i64, list(rows))}
        super().__init__(operands=[stacked, layer], result_types=[BufferType(shape, t.dtype)], attributes=attrs)

    @property
    def row_range(self) -> tuple[int, int] | None:
        """(start, count) of the rows this view takes of the layer's slice; None for all of them."""
        return None if self.rows is None else tuple(self.rows.get_values())

    def verify_(self) -> None:
        stacked, result = buffer_type(self.stacked), buffer_type(self.result)
        expected = stacked.shape[1:]
        if self.rows is not None:
            rows = list(self.rows.get_values())
            if len(stacked.shape) < 2 or len(rows) != 2 or rows[0] < 0 or rows[1] <= 0 or sum(rows) > stacked.shape[1]:
                raise VerifyException(f"rows {rows} must be (start, count) within the {list(stacked.shape[1:2])} "
                                      "rows of a layer")
            expected = (rows[1], *stacked.shape[2:])
        if not stacked.shape or expected != result.shape or stacked.dtype != result.dtype:
            raise VerifyException(
                f"a layer view of {list(stacked.shape)} {stacked.dtype.value} is "
                f"{list(expected)} {stacked.dtype.value}, got {list(result.shape)} {result.dtype.value}"
            )


@irdl_op_definition
class RecomputeSegmentOp(SchedOp):
    """Forward ops replayed during backward: ``mdsl.sched.recompute_segment "mlp" layer(%l) { ... }``."""

    name = "mdsl.sched.recompute_segment"

    segment = prop_def(StringAttr)
    layer = opt_operand_def(IndexType)
    body = region_def("single_block")

    traits = traits_def(NoTerminator())

    def __init__(self, segment: str, body: Region | None = None, layer: SSAValue | None = None):
        super().__init__(
            operands=[[layer] if layer is not None else []],
            properties={"segment": StringAttr(segment)},
            regions=[body if body is not None else Region(Block())],
        )

    def verify_op(self) -> None:
        if not self.segment.data:
            raise VerifyException("a recompute segment needs a name")

    @classmethod
    def parse(cls, parser: Parser) -> RecomputeSegmentOp:
        segment = parser.parse_str_literal()
        layer = None
        if parser.parse_optional_keyword("layer"):
            with parser.in_parens():
                layer = parser.resolve_operand(parser.parse_unresolved_operand(), IndexType())
        attrs = parser.parse_optional_attr_dict_with_keyword()
        op = RecomputeSegmentOp(segment, _parse_body(parser), layer)
        if attrs is not None:
            op.attributes |= attrs.data
        return op

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_string_literal(self.segment.data)
        if self.layer is not None:
            printer.print_string(" layer(")
            printer.print_operand(self.layer)
            printer.print_string(")")
        printer.print_op_attributes(self.attributes, print_keyword=True)
        printer.print_string(" ")
        printer.print_region(self.body, print_empty_block=False)


# ----------------------------------------------------------------------------
# Distribution: collectives, streams, synchronization
# ----------------------------------------------------------------------------


def _check_rank_attr(kind: str, what: str, rank: IntegerAttr | None, needed: bool) -> None:
    """A ``peer`` (send/recv) or ``root`` (broadcast) rank: present exactly where needed, non-negative."""
    if needed and rank is None:
        raise VerifyException(f"{kind} needs a '{what}' rank")
    if not needed and rank is not None:
        raise VerifyException(f"{kind} takes no '{what}' rank")
    if rank is not None and rank.value.data < 0:
        raise VerifyException(f"{what} rank must be non-negative, got {rank.value.data}")


@irdl_op_definition
class CollectiveOp(SchedOp):
    """A collective over a process group:

    ``mdsl.sched.collective "all_reduce" %g -> %g group "dp" {op = "sum", size = 2}``; send
    and recv take ``peer``, broadcast takes ``root``; ``size`` is the group's ranks where the
    lowering knows it (``--emit=comm-report`` counts the bytes a rank sends with it).
    """

    name = "mdsl.sched.collective"

    kind = prop_def(StringAttr)
    input = operand_def(BufferType)
    output = operand_def(BufferType)
    group = prop_def(StringAttr)
    op = opt_attr_def(StringAttr)
    peer = opt_attr_def(IntegerAttr)
    root = opt_attr_def(IntegerAttr)
    size = opt_attr_def(IntegerAttr)

    assembly_format = "$kind $input `->` $output `group` $group attr-dict `:` type($input) `->` type($output)"

    REDUCING: ClassVar[tuple[str, ...]] = ("all_reduce", "reduce_scatter")

    def __init__(
        self,
        kind: str,
        input: SSAValue,
        output: SSAValue,
        group: str,
        *,
        op: str | None = None,
        peer: int | None = None,
        root: int | None = None,
        stream: str | None = None,
        size: int | None = None,
    ):
        attrs = _non_default(
            op=None if op is None else StringAttr(op),
            peer=None if peer is None else IntegerAttr(peer, i64),
            root=None if root is None else IntegerAttr(root, i64),
            size=None if size is None else IntegerAttr(size, i64),
            stream=_stream_attr(stream),
        )
        super().__init__(
            operands=[input, output],
            properties={"kind": StringAttr(kind), "group": StringAttr(group)},
            attributes=attrs,
        )

    def verify_op(self) -> None:
        kind = self.kind.data
        _check_choice("collective", kind, COLLECTIVES)
        if not self.group.data:
            raise VerifyException("a collective needs a group")
        if kind in self.REDUCING:
            if self.op is None:
                raise VerifyException(f"{kind} needs a reduction 'op' ({', '.join(REDUCE_OPS)})")
            _check_choice("op", self.op.data, REDUCE_OPS)
        elif self.op is not None:
            raise VerifyException(f"{kind} takes no reduction op")
        _check_rank_attr(kind, "peer", self.peer, needed=kind in ("send", "recv"))
        _check_rank_attr(kind, "root", self.root, needed=kind == "broadcast")
        src, dst = buffer_type(self.input), buffer_type(self.output)
        if kind in ("all_reduce", "broadcast", "send", "recv", "all_to_all") and src.nbytes != dst.nbytes:
            raise VerifyException(f"{kind} input and output differ in size ({src.nbytes} vs {dst.nbytes} bytes)")
        if kind == "all_gather" and dst.nbytes % max(src.nbytes, 1):
            raise VerifyException("all_gather output must be a whole multiple of its input")
        if kind == "reduce_scatter" and src.nbytes % max(dst.nbytes, 1):
            raise VerifyException("reduce_scatter input must be a whole multiple of its output")
        if self.size is not None:
            self._verify_size(kind, src, dst, self.size.value.data)

    @staticmethod
    def _verify_size(kind: str, src: BufferType, dst: BufferType, size: int) -> None:
        if size < 1:
            raise VerifyException(f"a group has at least one rank, got size {size}")
        whole, part = (dst, src) if kind == "all_gather" else (src, dst)
        if kind in ("all_gather", "reduce_scatter") and whole.nbytes != size * part.nbytes:
            raise VerifyException(f"{kind} over {size} ranks: {whole.nbytes} bytes whole, {part.nbytes} a rank's")


@irdl_op_definition
class StreamOp(IRDLOperation):
    """Declares a stream of the program: ``mdsl.sched.stream @comm priority -1``."""

    name = "mdsl.sched.stream"

    sym_name = prop_def(SymbolNameConstraint())
    priority = prop_def(IntegerAttr)

    traits = traits_def(SymbolOpInterface(), HasParent(ProgramOp))

    def __init__(self, name: str, priority: int = 0):
        super().__init__(properties={"sym_name": StringAttr(name), "priority": IntegerAttr(priority, i64)})

    @classmethod
    def parse(cls, parser: Parser) -> StreamOp:
        name = parser.parse_symbol_name().data
        parser.parse_keyword("priority")
        op = StreamOp(name, _parse_i64(parser))
        op.attributes |= parser.parse_optional_attr_dict()
        return op

    def print(self, printer: Printer) -> None:
        printer.print_string(f" @{self.sym_name.data} priority {self.priority.value.data}")
        printer.print_op_attributes(self.attributes)


@irdl_op_definition
class SyncOp(IRDLOperation):
    """``mdsl.sched.sync @compute waits @comm``: work on the first stream issued after
    this point waits for all work issued so far on the second."""

    name = "mdsl.sched.sync"

    waiter = prop_def(SymbolRefAttr)
    waited = prop_def(SymbolRefAttr)

    assembly_format = "$waiter `waits` $waited attr-dict"

    def __init__(self, waiter: str, waited: str):
        super().__init__(properties={"waiter": SymbolRefAttr(waiter), "waited": SymbolRefAttr(waited)})

    def verify_(self) -> None:
        program = _enclosing_program(self)
        for ref in (self.waiter, self.waited):
            if program is None or not isinstance(SymbolTable.lookup_symbol(program, ref), StreamOp):
                raise VerifyException(f"stream {ref} is not declared in the program")
        if self.waiter == self.waited:
            raise VerifyException("a stream cannot wait on itself")


SCHED_OPS: tuple[type[Operation], ...] = (
    ProgramOp,
    BufferOp,
    LaunchOp,
    GemmOp,
    AttentionOp,
    AttentionBackwardOp,
    MemsetOp,
    AssertOp,
    CopyOp,
    LayerLoopOp,
    LayerViewOp,
    RecomputeSegmentOp,
    CollectiveOp,
    StreamOp,
    SyncOp,
)

Sched = Dialect("mdsl.sched", list(SCHED_OPS), [BufferType])
