"""Element types shared by the ``mdsl.graph`` and ``mdsl.sched`` dialects.

One table: the spelling used in the DSL and in the IR, the storage size in
bits, and the kind (float, integer or bool).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from xdsl.parser import AttrParser
from xdsl.utils.exceptions import VerifyException


@dataclass(frozen=True)
class DTypeInfo:
    bits: int
    kind: str  # "float" | "int" | "bool"


class DType(str, Enum):
    """An element type; its value is its spelling in the DSL and the IR."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"
    FP4_E2M1 = "fp4_e2m1"
    INT8 = "int8"
    INT32 = "int32"
    INT64 = "int64"
    BOOL = "bool"

    @property
    def info(self) -> DTypeInfo:
        return _INFO[self]

    @property
    def bits(self) -> int:
        return self.info.bits

    @property
    def is_float(self) -> bool:
        return self.info.kind == "float"

    @property
    def is_integer(self) -> bool:
        return self.info.kind == "int"

    def byte_size(self, elements: int) -> int:
        """Bytes needed to store ``elements`` values (sub-byte types are packed)."""
        return (elements * self.bits + 7) // 8

    @classmethod
    def parse(cls, spelling: str) -> DType:
        try:
            return cls(spelling)
        except ValueError:
            raise ValueError(
                f"unknown element type '{spelling}' "
                f"(expected one of {', '.join(d.value for d in cls)})"
            ) from None


_INFO: dict[DType, DTypeInfo] = {
    DType.BF16: DTypeInfo(16, "float"),
    DType.FP16: DTypeInfo(16, "float"),
    DType.FP32: DTypeInfo(32, "float"),
    DType.FP8_E4M3: DTypeInfo(8, "float"),
    DType.FP8_E5M2: DTypeInfo(8, "float"),
    DType.FP4_E2M1: DTypeInfo(4, "float"),
    DType.INT8: DTypeInfo(8, "int"),
    DType.INT32: DTypeInfo(32, "int"),
    DType.INT64: DTypeInfo(64, "int"),
    DType.BOOL: DTypeInfo(8, "bool"),
}

DTYPE_SPELLINGS: tuple[str, ...] = tuple(d.value for d in DType)


def parse_dtype_spelling(parser: AttrParser) -> str:
    """Parse an element type spelling in IR text, as a located error when unknown."""
    start = parser.pos
    spelling = parser.parse_identifier(" (an element type)")
    try:
        DType.parse(spelling)
    except ValueError as err:
        parser.raise_error(str(err), start, parser.pos)
    return spelling


def verify_dtype_spelling(spelling: str) -> None:
    """Raise a VerifyException for an unknown element type spelling."""
    try:
        DType.parse(spelling)
    except ValueError as err:
        raise VerifyException(str(err)) from None
