"""``@dtype(T)`` on a flow value (spec 7.4.1, binding): the value the flow names is cast to ``T``.

``x -> matmul(w) -> h @dtype(fp32)`` in a bf16 model computes the matmul as written, then an
explicit ``cast`` (spec 7.4.4: casts are nodes of the IR) makes ``h`` an fp32 tensor; ``h`` is
fp32 wherever it is kept (saved for the backward, an output). Each consumer reads it back at the
dtype the graph computed it in, through a cast of its own (the rest of the program keeps its
dtypes, so the op verifiers check them end to end): a flow reading ``h`` by name, the next stage
of a chain after a stage annotated ``@dtype``. An untyped output (``out: [B, d]``) bound to such
a value keeps ``T``; one declared with another dtype is cast to it as declared outputs are.
Casts between bf16, fp16 and fp32 are implicit (spec 7.4.4); any other is E003 at the annotation.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import ArrayAttr
from xdsl.ir import Operation, SSAValue

from modeldsl.diagnostics import Span
from modeldsl.dialects.annotations import ANNOTATIONS_ATTR_NAME, DtypeAttr
from modeldsl.dialects.dtypes import DType
from modeldsl.dialects.graph_primitives import CastOp
from modeldsl.dialects.graph_types import TensorType

IMPLICIT = frozenset({DType.BF16, DType.FP16, DType.FP32})


class DtypesMixin:
    """``@dtype`` on flow values: the cast to the annotated dtype and the casts back for consumers."""

    retyped: dict[SSAValue, TensorType]  # a value @dtype made -> the type its consumers read

    def dtype_of(self, annotations: Sequence) -> DtypeAttr | None:
        return next((a for a in annotations if isinstance(a, DtypeAttr)), None)

    def cast_to_annotated(self, attr: DtypeAttr, named: Sequence[tuple[str, SSAValue]],
                          span: Span) -> list[SSAValue]:
        """Each of ``named`` (name, value) cast to ``attr``'s dtype (the value itself where it has
        it); E003 at ``span`` for a conversion that is not implicit."""
        target = DType(attr["type"])
        result = []
        for name, value in named:
            actual = value.type.dtype
            if actual == target:
                result.append(value)
                continue
            if not {actual, target} <= IMPLICIT:
                self.sink.error("E003", f"@dtype({target.value}): '{name}' is {actual.value}, and {actual.value} to "
                                f"{target.value} is not an implicit conversion (spec 7.4.4)", span,
                                "@dtype converts between bf16, fp16 and fp32; other dtypes need quantization")
                result.append(value)
                continue
            cast = CastOp.make([value], [value.type.with_dtype(target)], {ANNOTATIONS_ATTR_NAME: ArrayAttr([attr])})
            if name != "_":
                cast.results[0].name_hint, value.name_hint = name, f"{name}_{actual.value}"
            _drop_annotation(value, attr)
            self.block.add_op(cast)
            self.retyped[cast.results[0]] = value.type
            result.append(cast.results[0])
        return result

    def read_back(self, value: SSAValue) -> SSAValue:
        """What a consumer reads of ``value``: a cast back to the dtype the graph computed a
        ``@dtype`` value in; any other value itself."""
        computed = self.retyped.get(value)
        if computed is None:
            return value
        cast = CastOp.make([value], [computed])
        self.block.add_op(cast)
        return cast.results[0]

    def keeps_annotated_dtype(self, value: SSAValue) -> bool:
        """Whether ``value`` was made by ``@dtype`` (an untyped output bound to it keeps its dtype)."""
        return value in self.retyped


def _drop_annotation(value: SSAValue, attr: DtypeAttr) -> None:
    """The ``@dtype`` belongs to the cast that applies it, not to the op that made the value."""
    owner = value.owner
    current = owner.attributes.get(ANNOTATIONS_ATTR_NAME) if isinstance(owner, Operation) else None
    if not isinstance(current, ArrayAttr) or attr not in current.data:
        return
    kept = [a for a in current.data if a != attr]
    if kept:
        owner.attributes[ANNOTATIONS_ATTR_NAME] = ArrayAttr(kept)
    else:
        del owner.attributes[ANNOTATIONS_ATTR_NAME]
