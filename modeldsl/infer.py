"""Result-type inference for the primitives: operand types + parameters -> result types.

The frontend calls :func:`infer_result_types` for every primitive it lowers,
so shapes flow forward through the graph symbolically (spec 3.6). Each
primitive's rule is on its entry in :mod:`modeldsl.prims` (one module per
family); it returns the result types, and the op's own verifier then checks
the operands, so a rule never has to re-check what the verifier enforces. A
rule raises :class:`InferenceError` when the result cannot be determined (for
example a ``view`` without a target shape), which the frontend reports as E004.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from xdsl.utils.exceptions import VerifyException

from modeldsl.dialects.graph_types import TensorType
from modeldsl.prims import by_name
from modeldsl.prims.base import InferenceError, ShapeRule
from modeldsl.symbolic import SymbolicError

__all__ = ["InferenceError", "ShapeRule", "infer_result_types"]


def infer_result_types(primitive: str, operands: Sequence[TensorType], params: dict[str, Any]) -> list[TensorType]:
    """Result types of ``primitive`` applied to operands of these types with these parameters."""
    entry = by_name().get(primitive)
    if entry is None:
        raise InferenceError(f"no shape rule for primitive '{primitive}'")
    try:
        return entry.infer(list(operands), params)
    except (IndexError, KeyError) as err:
        raise InferenceError(f"missing operand or parameter ({err})") from None
    except (TypeError, ValueError, ZeroDivisionError, SymbolicError, VerifyException) as err:
        raise InferenceError(f"cannot infer the result type ({err})") from None
