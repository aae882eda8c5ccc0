"""The conditions of ``@assert(condition, message)`` (spec 7.7.1), read into checks.

A condition is a conjunction (``&&``) of checks on the tensors its flow computes, in the spec's
own spelling::

    !has_nan(out)                      no element is NaN          (runtime: no_nan)
    !has_inf(out)                      no element is infinite     (runtime: no_inf)
    !has_nan_or_inf(out), is_finite(out), all_finite(out)
                                       every element is finite    (runtime: finite)
    all(out >= 0), all(out < 1.5), all(0 <= out)
                                       every element is in range  (runtime: ge, gt, le, lt)
    out.shape[-1] == d_model           a size                     (compile time)

Parentheses group; ``||`` and other forms are refused with a message and a hint
(:class:`ConditionError`, which the frontend reports as E008). The runtime checks become
``mdsl.sched.assert`` ops, one per check; a shape check is decided when the flow is lowered.
This module reads text only: every layer may import it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# the checks an ``mdsl.sched.assert`` op runs, and what each says of every element
RUNTIME_CHECKS: dict[str, str] = {
    "no_nan": "is not NaN",
    "no_inf": "is not infinite",
    "finite": "is finite",
    "ge": ">=",
    "gt": ">",
    "le": "<=",
    "lt": "<",
}
BOUNDED = ("ge", "gt", "le", "lt")
NEGATED = {"has_nan": "no_nan", "has_inf": "no_inf", "has_nan_or_inf": "finite"}
POSITIVE = {"is_finite": "finite", "all_finite": "finite"}
COMPARISONS = {">=": "ge", ">": "gt", "<=": "le", "<": "lt"}
MIRRORED = {"ge": "le", "gt": "lt", "le": "ge", "lt": "gt"}  # 0 <= x is x >= 0
HINT = ("write checks joined by &&: !has_nan(x), !has_inf(x), !has_nan_or_inf(x), all(x >= 0), "
        "x.shape[-1] == d")


class ConditionError(Exception):
    def __init__(self, message: str, hint: str = HINT):
        super().__init__(message)
        self.message, self.hint = message, hint


@dataclass(frozen=True)
class Check:
    """One check of a condition: a runtime ``kind`` (one of :data:`RUNTIME_CHECKS`, with ``bound``
    for a range), or ``shape``: ``tensor.shape[dim] == size`` (``size`` an integer or a name)."""

    kind: str
    tensor: str
    bound: float | None = None
    dim: int | None = None
    size: int | str | None = None

    @property
    def text(self) -> str:
        if self.kind == "shape":
            return f"{self.tensor}.shape[{self.dim}] == {self.size}"
        if self.kind in BOUNDED:
            return f"all({self.tensor} {RUNTIME_CHECKS[self.kind]} {self.bound:g})"
        return {"no_nan": "!has_nan({})", "no_inf": "!has_inf({})", "finite": "!has_nan_or_inf({})"}[
            self.kind].format(self.tensor)

    def holds(self, values) -> bool:
        """Whether a runtime check holds for an array of ``values`` (numpy; any float dtype)."""
        import numpy as np

        x = np.asarray(values)
        if x.dtype.kind != "f":
            x = x.astype(np.float32)
        with np.errstate(invalid="ignore"):
            if self.kind == "no_nan":
                return not bool(np.isnan(x).any())
            if self.kind == "no_inf":
                return not bool(np.isinf(x).any())
            if self.kind == "finite":
                return bool(np.isfinite(x).all())
            compare = {"ge": np.greater_equal, "gt": np.greater, "le": np.less_equal, "lt": np.less}[self.kind]
            return bool(compare(x, self.bound).all())  # NaN compares false: it fails a range


TOKEN = re.compile(r"\s*(?:(?P<num>-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)|(?P<name>[A-Za-z_]\w*)"
                   r"|(?P<op>&&|\|\||==|!=|>=|<=|[!()<>\[\].,]))")


def parse_condition(text: str) -> list[Check]:
    """The checks of a condition (ConditionError for anything else)."""
    tokens = _tokens(text)
    parser = _Parser(tokens, text)
    checks = parser.conjunction()
    if parser.peek() is not None:
        raise ConditionError(f"unexpected '{parser.peek()}' in the condition '{text}'")
    return checks


def _tokens(text: str) -> list[str]:
    tokens, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise ConditionError(f"cannot read the condition '{text}' at '{text[pos:].strip()}'")
        tokens.append(match.group(match.lastgroup))
        pos = match.end()
    if not tokens:
        raise ConditionError("the condition is empty")
    return tokens


class _Parser:
    def __init__(self, tokens: list[str], text: str):
        self.tokens, self.pos, self.text = tokens, 0, text

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            found = f"'{token}'" if token is not None else "the end"
            raise ConditionError(f"expected '{expected or 'more'}' in the condition '{self.text}', found {found}")
        self.pos += 1
        return token

    def conjunction(self) -> list[Check]:
        checks = self.term()
        while self.peek() in ("&&", "||"):
            if self.take() == "||":
                raise ConditionError(f"'||' in the condition '{self.text}': an assertion is a conjunction of checks",
                                     "split it into checks that must all hold, joined by &&")
            checks += self.term()
        return checks

    def term(self) -> list[Check]:
        token = self.peek()
        if token == "(":
            self.take("(")
            checks = self.conjunction()
            self.take(")")
            return checks
        if token == "!":
            self.take("!")
            name = self.name()
            if name not in NEGATED:
                raise ConditionError(f"'!{name}(...)' is no check", f"negate {', '.join(NEGATED)}; {HINT}")
            return [Check(NEGATED[name], self.argument())]
        name = self.name()
        if name in POSITIVE:
            return [Check(POSITIVE[name], self.argument())]
        if name == "all":
            self.take("(")
            check = self.comparison()
            self.take(")")
            return [check]
        if name in NEGATED:
            raise ConditionError(f"'{name}(...)' asserts the tensor holds a {name.removeprefix('has_')}",
                                 f"negate it: !{name}(...)")
        if self.peek() == ".":
            return [self.shape(name)]
        raise ConditionError(f"'{name}' is no check in the condition '{self.text}'")

    def name(self) -> str:
        token = self.take()
        if not re.fullmatch(r"[A-Za-z_]\w*", token):
            raise ConditionError(f"expected a name in the condition '{self.text}', found '{token}'")
        return token

    def argument(self) -> str:
        self.take("(")
        tensor = self.name()
        self.take(")")
        return tensor

    def number(self) -> float:
        token = self.take()
        try:
            value = float(token)
        except ValueError:
            raise ConditionError(f"expected a number in the condition '{self.text}', found '{token}'") from None
        if not math.isfinite(value):
            raise ConditionError(f"the bound {token} is not finite")
        return value

    def comparison(self) -> Check:
        """``x >= 0`` or ``0 <= x`` inside ``all(...)``."""
        if re.fullmatch(r"[A-Za-z_]\w*", self.peek() or ""):
            tensor = self.name()
            kind = self.comparator()
            return Check(kind, tensor, self.number())
        bound = self.number()
        kind = self.comparator()
        return Check(MIRRORED[kind], self.name(), bound)

    def comparator(self) -> str:
        token = self.take()
        if token not in COMPARISONS:
            raise ConditionError(f"all(...) compares with >=, >, <= or <, not '{token}'")
        return COMPARISONS[token]

    def shape(self, tensor: str) -> Check:
        """``x.shape[i] == size``."""
        self.take(".")
        if self.take() != "shape":
            raise ConditionError(f"only '{tensor}.shape[i]' may follow the tensor in the condition '{self.text}'")
        self.take("[")
        index = self.take()
        if not re.fullmatch(r"-?\d+", index):
            raise ConditionError(f"'{tensor}.shape[{index}]': the dimension is an integer")
        self.take("]")
        self.take("==")
        size = self.take()
        if re.fullmatch(r"\d+", size):
            return Check("shape", tensor, dim=int(index), size=int(size))
        if re.fullmatch(r"[A-Za-z_]\w*", size):
            return Check("shape", tensor, dim=int(index), size=size)
        raise ConditionError(f"'{tensor}.shape[{index}] == {size}': compare with an integer or a size's name")
