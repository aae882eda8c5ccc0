"""The ``mdsl.graph`` dialect: the functional, typed graph of a model.

A model is one ``mdsl.graph.model`` op holding its config values, its
parameter declarations and its functions (forward, backward, block bodies).
Values are tensors of :class:`TensorType` with symbolic shapes; every
primitive of spec 000 section 6 is one op, and annotations (section 7) are
typed attributes in an ``annotations`` array on ops and parameters.

Stacked blocks (``[n_layers] x Block``) are one block body function run by
``mdsl.graph.stack`` with per-layer parameters whose leading dimension is the
layer count.

Matmul transpose modes follow the primitive's own definition (spec 6.1.1):
``NT`` is ``A @ B^T``, ``TN`` is ``A^T @ B``; a linear layer ``x @ W^T``
with ``W: [out, in]`` is ``matmul(x, W) {transpose = "NT"}``.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import (
    ArrayAttr,
    DictionaryAttr,
    FlatSymbolRefAttr,
    FunctionType,
    StringAttr,
    SymbolNameConstraint,
    SymbolRefAttr,
    UnitAttr,
)
from xdsl.dialects.utils import parse_func_op_like, print_func_op_like
from xdsl.ir import Attribute, Block, Dialect, Operation, Region, SSAValue
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    irdl_op_definition,
    opt_attr_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import (
    CallableOpInterface,
    HasParent,
    IsolatedFromAbove,
    IsTerminator,
    NoTerminator,
    ReturnLike,
    SymbolOpInterface,
    SymbolTable,
    SymbolUserOpInterface,
)
from xdsl.utils.exceptions import VerifyException

from modeldsl.dialects.annotations import ANNOTATIONS, check_annotations
from modeldsl.dialects.graph_custom import CustomOp
from modeldsl.dialects.graph_primitives import PRIMITIVE_OPS
from modeldsl.dialects.graph_types import (
    GRAPH_TYPES_AND_ATTRS,
    DimsAttr,
    ExprAttr,
    TensorType,
)
from modeldsl.symbolic import definitely_different

FUNC_KINDS = ("forward", "backward", "block", "block_backward", "helper")


# ----------------------------------------------------------------------------
# Structure: model, parameters, functions, calls, stacks
# ----------------------------------------------------------------------------


@irdl_op_definition
class ModelOp(IRDLOperation):
    """A model: config values, parameter declarations and functions.

    ``config`` maps config names (``d_model``, ``n_layers``, ...) to their
    default values; ``hf_config``, ``hf_mapping`` and ``hf_export`` carry the
    HuggingFace sections of the DSL model. ``baked`` lists the integer config
    values that lowering fixed into attributes or ``if`` choices (they stay
    symbols in shapes, but only lowering again can change them). ``invariants``
    keeps the gradient invariants of the primitives it uses (spec 9.8.3,
    ``{softmax = {backward_uses = ["out"], at = "file:line:col"}}``: each a
    primitive of this dialect, each tensor one of its op's operands or results;
    :mod:`modeldsl.invariants` checks them against the graph and its backward).
    """

    name = "mdsl.graph.model"

    sym_name = prop_def(SymbolNameConstraint())
    config = opt_prop_def(DictionaryAttr)
    hf_config = opt_attr_def(DictionaryAttr)
    hf_mapping = opt_attr_def(DictionaryAttr)
    hf_export = opt_attr_def(DictionaryAttr)
    invariants = opt_attr_def(DictionaryAttr)
    body = region_def("single_block")

    traits = traits_def(SymbolOpInterface(), SymbolTable(), NoTerminator(), IsolatedFromAbove())

    def verify_(self) -> None:
        if self.invariants is not None:
            _verify_invariants(self.invariants)

    assembly_format = "$sym_name (`config` $config^)? attr-dict-with-keyword $body"

    def __init__(
        self,
        name: str,
        config: dict[str, Attribute] | None = None,
        body: Region | None = None,
    ):
        super().__init__(
            properties={
                "sym_name": StringAttr(name),
                "config": DictionaryAttr(config) if config is not None else None,
            },
            regions=[body if body is not None else Region(Block())],
        )

    @property
    def config_values(self) -> dict[str, Attribute]:
        return dict(self.config.data) if self.config is not None else {}

    def params(self) -> list["ParamOp"]:
        return [op for op in self.body.block.ops if isinstance(op, ParamOp)]

    def funcs(self) -> list["FuncOp"]:
        return [op for op in self.body.block.ops if isinstance(op, FuncOp)]

    def lookup(self, name: str) -> Operation | None:
        return SymbolTable.lookup_symbol(self, name)


ADAPTER_ATTR = "adapter"  # the dictionary of a parameter mdsl-adapters declared
# the dictionary of a parameter mdsl-quantize-frozen stores in a narrower dtype (role "data": its dtype, the
# compute dtype it is read in and, for fp8, its scale parameter) or of that scale (role "scale")
QUANTIZED_ATTR = "quantized"


@irdl_op_definition
class ParamOp(IRDLOperation):
    """A parameter declaration: ``mdsl.graph.param @wq : !mdsl.graph.tensor<...>``.

    Per-layer parameters of a stack have the layer count as leading dimension.
    Annotations (frozen, trainable, shard, dtype, memory, ...) go in the
    ``annotations`` attribute. A parameter ``mdsl-adapters`` declared (a LoRA
    ``lora_A`` or ``lora_B``) carries its ``adapter`` dictionary: no checkpoint
    rule fills it. A frozen weight ``mdsl-quantize-frozen`` stores narrower (and its
    scale) carries a ``quantized`` dictionary (:attr:`quantized`).
    """

    name = "mdsl.graph.param"

    sym_name = prop_def(SymbolNameConstraint())
    param_type = prop_def(TensorType)

    traits = traits_def(SymbolOpInterface(), HasParent(ModelOp))

    assembly_format = "$sym_name `:` qualified($param_type) attr-dict"

    def verify_(self) -> None:
        check_annotations(self)

    @property
    def is_adapter(self) -> bool:
        return ADAPTER_ATTR in self.attributes

    @property
    def quantized(self) -> dict[str, str] | None:
        """The ``quantized`` dictionary ``mdsl-quantize-frozen`` gave the parameter (its values as
        strings), None for a parameter stored as declared."""
        attr = self.attributes.get(QUANTIZED_ATTR)
        if not isinstance(attr, DictionaryAttr):
            return None
        return {key: value.data for key, value in attr.data.items() if isinstance(value, StringAttr)}

    def __init__(self, name: str, param_type: TensorType, annotations: Sequence[Attribute] = ()):
        attributes = {"annotations": ArrayAttr(annotations)} if annotations else {}
        super().__init__(
            properties={"sym_name": StringAttr(name), "param_type": param_type},
            attributes=attributes,
        )


class ParamRefSymbolUser(SymbolUserOpInterface):
    def verify(self, op: Operation) -> None:
        assert isinstance(op, ParamRefOp)
        target = SymbolTable.lookup_symbol(op, op.param)
        if not isinstance(target, ParamOp):
            raise VerifyException(f"'{op.param}' does not name a parameter of the model")
        if target.param_type != op.result.type:
            raise VerifyException(
                f"type {op.result.type} does not match the declaration of "
                f"'{op.param}' ({target.param_type})"
            )


@irdl_op_definition
class ParamRefOp(IRDLOperation):
    """The value of a declared parameter inside a function."""

    name = "mdsl.graph.param_ref"

    param = prop_def(SymbolRefAttr)
    result = result_def(TensorType)

    traits = traits_def(ParamRefSymbolUser())

    assembly_format = "$param attr-dict `:` type($result)"

    def __init__(self, param: str, result_type: TensorType):
        super().__init__(
            properties={"param": FlatSymbolRefAttr(param)}, result_types=[result_type]
        )


class GraphFuncCallable(CallableOpInterface):
    @classmethod
    def get_callable_region(cls, op: Operation) -> Region:
        assert isinstance(op, FuncOp)
        return op.body

    @classmethod
    def get_argument_types(cls, op: Operation) -> tuple[Attribute, ...]:
        assert isinstance(op, FuncOp)
        return op.function_type.inputs.data

    @classmethod
    def get_result_types(cls, op: Operation) -> tuple[Attribute, ...]:
        assert isinstance(op, FuncOp)
        return op.function_type.outputs.data


@irdl_op_definition
class FuncOp(IRDLOperation):
    """A function of a model: ``mdsl.graph.func @forward(%x: !t) -> !t { ... }``.

    ``kind`` says what it is: forward, backward, block (a block body),
    block_backward or helper.
    """

    name = "mdsl.graph.func"

    sym_name = prop_def(SymbolNameConstraint())
    function_type = prop_def(FunctionType)
    arg_attrs = opt_prop_def(ArrayAttr[DictionaryAttr])
    res_attrs = opt_prop_def(ArrayAttr[DictionaryAttr])
    kind = opt_attr_def(StringAttr)
    body = region_def("single_block")

    traits = traits_def(
        SymbolOpInterface(), GraphFuncCallable(), HasParent(ModelOp), IsolatedFromAbove()
    )

    def __init__(
        self,
        name: str,
        inputs: Sequence[Attribute],
        outputs: Sequence[Attribute],
        body: Region | None = None,
        kind: str | None = None,
    ):
        function_type = FunctionType.from_lists(inputs, outputs)
        super().__init__(
            properties={"sym_name": StringAttr(name), "function_type": function_type},
            attributes={"kind": StringAttr(kind)} if kind else {},
            regions=[body if body is not None else Region(Block(arg_types=inputs))],
        )

    def verify_(self) -> None:
        block_types = tuple(self.body.block.arg_types)
        if block_types != self.function_type.inputs.data:
            raise VerifyException("entry block arguments must match the function inputs")
        if self.kind is not None and self.kind.data not in FUNC_KINDS:
            raise VerifyException(
                f"kind '{self.kind.data}' is not one of {', '.join(FUNC_KINDS)}"
            )

    @classmethod
    def parse(cls, parser: Parser) -> "FuncOp":
        name, inputs, outputs, region, extra_attrs, arg_attrs, res_attrs = parse_func_op_like(
            parser, reserved_attr_names=("sym_name", "function_type")
        )
        op = FuncOp(name, inputs, outputs, region)
        if extra_attrs is not None:
            op.attributes |= extra_attrs.data
        if arg_attrs is not None:
            op.arg_attrs = arg_attrs
        if res_attrs is not None:
            op.res_attrs = res_attrs
        return op

    def print(self, printer: Printer) -> None:
        print_func_op_like(
            printer,
            self.sym_name,
            self.function_type,
            self.body,
            self.attributes,
            arg_attrs=self.arg_attrs,
            res_attrs=self.res_attrs,
            reserved_attr_names=("sym_name", "function_type"),
        )


@irdl_op_definition
class ReturnOp(IRDLOperation):
    """Returns the results of a ``mdsl.graph.func``."""

    name = "mdsl.graph.return"

    values = var_operand_def()

    traits = traits_def(HasParent(FuncOp), IsTerminator(), ReturnLike())

    assembly_format = "attr-dict ($values^ `:` type($values))?"

    def __init__(self, *values: SSAValue | Operation):
        super().__init__(operands=[values])

    def verify_(self) -> None:
        func = self.parent_op()
        assert isinstance(func, FuncOp)
        expected = func.function_type.outputs.data
        if tuple(self.values.types) != expected:
            raise VerifyException(
                f"returned types ({', '.join(map(str, self.values.types))}) do not match "
                f"the function results ({', '.join(map(str, expected))})"
            )


@irdl_op_definition
class BackwardStartOp(IRDLOperation):
    """Where a gradient function's backward part starts, while a pass rewrites ops on either side of
    it: ``mdsl-fuse`` places one at ``forward_ops`` and takes it out again, counting the ops before
    it. It computes nothing and is never left in a pass's output."""

    name = "mdsl.graph.backward_start"

    traits = traits_def(HasParent(FuncOp))

    assembly_format = "attr-dict"

    def verify_(self) -> None:
        func = self.parent_op()
        if isinstance(func, FuncOp) and "forward_ops" not in func.attributes:
            raise VerifyException("stands in a function that is no gradient function (it has no forward_ops)")


def _lookup_func(op: Operation, callee: SymbolRefAttr) -> FuncOp:
    target = SymbolTable.lookup_symbol(op, callee)
    if not isinstance(target, FuncOp):
        raise VerifyException(f"'{callee}' does not name a function of the model")
    return target


def _check_types(what: str, expected: Sequence[Attribute], got: Sequence[Attribute]) -> None:
    if len(expected) != len(got):
        raise VerifyException(f"{what}: expected {len(expected)}, got {len(got)}")
    for i, (e, g) in enumerate(zip(expected, got)):
        if e != g:
            raise VerifyException(f"{what} #{i}: expected {e}, got {g}")


class CallSymbolUser(SymbolUserOpInterface):
    def verify(self, op: Operation) -> None:
        assert isinstance(op, CallOp)
        func = _lookup_func(op, op.callee)
        _check_types("argument", func.function_type.inputs.data, op.arguments.types)
        _check_types("result", func.function_type.outputs.data, op.res.types)


@irdl_op_definition
class CallOp(IRDLOperation):
    """Calls a function of the same model."""

    name = "mdsl.graph.call"

    callee = prop_def(SymbolRefAttr)
    arguments = var_operand_def()
    res = var_result_def()

    traits = traits_def(CallSymbolUser())

    assembly_format = "$callee `(` $arguments `)` attr-dict `:` functional-type($arguments, $res)"

    def __init__(self, callee: str, arguments: Sequence[SSAValue], result_types: Sequence[Attribute]):
        super().__init__(
            operands=[arguments],
            result_types=[result_types],
            properties={"callee": FlatSymbolRefAttr(callee)},
        )


class StackSymbolUser(SymbolUserOpInterface):
    def verify(self, op: Operation) -> None:
        assert isinstance(op, StackOp)
        func = _lookup_func(op, op.body)
        slice_types = [op.layer_slice_type(v.type) for v in op.per_layer]
        _check_types(
            "block body input",
            func.function_type.inputs.data,
            [*op.carried.types, *op.shared.types, *slice_types],
        )
        collected = [op.layer_slice_type(v.type) for v in op.collected]
        _check_types("block body result", func.function_type.outputs.data, [*op.carried.types, *collected])


@irdl_op_definition
class StackOp(IRDLOperation):
    """Runs one block body ``count`` times, threading the carried values.

    ``mdsl.graph.stack @block count #mdsl.graph.expr<n_layers> (%h : !t) shared(%freqs : !f)
    layers(%wq, %wk : !w, !w) -> !t``
    calls ``@block(carried..., shared..., per_layer[l]...)`` for ``l`` in
    ``0..count`` (from the last layer down with ``reverse``): carried values
    are threaded from layer to layer, shared values are the same for every
    layer (RoPE tables, masks), and each per-layer operand has the layer count
    as its leading dimension, the body receiving the slice of layer ``l``.
    The results are the carried values after the last layer, then the
    *collected* results: the body returns, after its carried values, one
    value per collected result, and layer ``l``'s value is slice ``l`` of it
    (the saved activations of a forward stack, the parameter gradients of a
    backward one).
    """

    name = "mdsl.graph.stack"

    body = prop_def(SymbolRefAttr)
    count = prop_def(ExprAttr)
    carried = var_operand_def(TensorType)
    shared = var_operand_def(TensorType)
    per_layer = var_operand_def(TensorType)
    res = var_result_def(TensorType)
    reverse = opt_prop_def(UnitAttr)

    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    traits = traits_def(StackSymbolUser())

    assembly_format = (
        "$body `count` qualified($count) (`reverse` $reverse^)? `(` $carried `:` type($carried) `)` "
        "(`shared` `(` $shared^ `:` type($shared) `)`)? "
        "(`layers` `(` $per_layer^ `:` type($per_layer) `)`)? attr-dict `->` type($res)"
    )

    def __init__(
        self,
        body: str,
        count: ExprAttr,
        carried: Sequence[SSAValue],
        per_layer: Sequence[SSAValue],
        shared: Sequence[SSAValue] = (),
        collected: Sequence[Attribute] = (),
        reverse: bool = False,
    ):
        super().__init__(
            operands=[carried, shared, per_layer],
            result_types=[[*(v.type for v in carried), *collected]],
            properties={"body": FlatSymbolRefAttr(body), "count": count,
                        **({"reverse": UnitAttr()} if reverse else {})},
        )

    @property
    def carried_results(self) -> Sequence[SSAValue]:
        return self.res[:len(self.carried)]

    @property
    def collected(self) -> Sequence[SSAValue]:
        """The stacked per-layer results (after the carried ones)."""
        return self.res[len(self.carried):]

    @staticmethod
    def stacked_type(count: Attribute, layer_type: Attribute) -> Attribute:
        """The type of a collected result whose layers have ``layer_type``."""
        assert isinstance(count, ExprAttr) and isinstance(layer_type, TensorType)
        return layer_type.with_shape([count.data, *layer_type.shape])

    @staticmethod
    def layer_slice_type(stacked: Attribute) -> Attribute:
        assert isinstance(stacked, TensorType)
        return stacked.with_shape(list(stacked.shape[1:]))

    def verify_(self) -> None:
        if len(self.res) < len(self.carried):
            raise VerifyException(f"result: expected at least {len(self.carried)} (the carried values), "
                                  f"got {len(self.res)}")
        _check_types("result", self.carried.types, [r.type for r in self.carried_results])
        for i, value in enumerate([*self.per_layer, *self.collected]):
            t = value.type
            assert isinstance(t, TensorType)
            if t.rank == 0 or t.is_variadic:
                raise VerifyException(f"{_stacked_what(self, i)} needs a leading layer dimension")
            if definitely_different(t.shape[0], self.count.data):
                raise VerifyException(
                    f"{_stacked_what(self, i)} has {t.shape[0]} layers, the stack runs {self.count.data}"
                )


INVARIANT_KINDS = ("backward_uses",)  # the gradient invariants a primitive declaration may state


def _verify_invariants(invariants: DictionaryAttr) -> None:
    """A model's ``invariants``: primitive -> {kind -> [its op's slot names], at -> "file:line:col"}."""
    ops = {op.name.removeprefix("mdsl.graph."): op for op in PRIMITIVE_OPS}
    for primitive, kinds in invariants.data.items():
        op = ops.get(primitive)
        if op is None:
            raise VerifyException(f"invariants name '{primitive}', which is no primitive of mdsl.graph")
        if not isinstance(kinds, DictionaryAttr):
            raise VerifyException(f"the invariants of {primitive} must be a dictionary of kinds")
        definition = op.get_irdl_definition()
        slots = [n for n, _ in definition.operands] + [n for n, _ in definition.results]
        for kind, names in kinds.data.items():
            if kind == "at":
                if not isinstance(names, StringAttr):
                    raise VerifyException(f"the 'at' of {primitive}'s invariants must be a string")
                continue
            if kind not in INVARIANT_KINDS:
                raise VerifyException(f"'{kind}' of {primitive} is no invariant (they are: "
                                      f"{', '.join(INVARIANT_KINDS)})")
            if not isinstance(names, ArrayAttr) or not all(isinstance(n, StringAttr) for n in names.data):
                raise VerifyException(f"{primitive}'s {kind} must be an array of tensor names")
            for name in names.data:
                if name.data not in slots:
                    raise VerifyException(f"{primitive}'s {kind} names '{name.data}', which is none of its "
                                          f"operands and results ({', '.join(slots)})")


def _stacked_what(stack: "StackOp", index: int) -> str:
    """How a verifier message names the ``index``-th stacked value (per-layer operands, then collected results)."""
    layers = len(stack.per_layer)
    return f"per-layer operand #{index}" if index < layers else f"collected result #{index - layers}"


STRUCTURE_OPS: tuple[type[Operation], ...] = (
    ModelOp,
    ParamOp,
    ParamRefOp,
    FuncOp,
    ReturnOp,
    CallOp,
    StackOp,
    BackwardStartOp,
)

Graph = Dialect(
    "mdsl.graph",
    [*STRUCTURE_OPS, *PRIMITIVE_OPS, CustomOp],
    [*GRAPH_TYPES_AND_ATTRS, *ANNOTATIONS],
)

__all__ = [
    "Graph",
    "TensorType",
    "DimsAttr",
    "ExprAttr",
    "ModelOp",
    "ParamOp",
    "ParamRefOp",
    "FuncOp",
    "ReturnOp",
    "CallOp",
    "StackOp",
    "BackwardStartOp",
    "CustomOp",
]
