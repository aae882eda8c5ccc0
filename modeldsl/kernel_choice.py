"""``@kernel(name, autotune=true, workspace=None, fallback=true)`` (spec 7.5.3): choosing a kernel.

The annotation names one of the implementations the kernel registry lists for the primitive of
the op it annotates (:func:`modeldsl.kernels.registry.implementations`). It takes effect in one
place: ``mdsl-lower-to-sched`` records the choice on the op it lowers the primitive to
(``implementation = "cudnn_sdpa"``, ``fallback = false`` when binding, ``workspace = N``), and
the executors honor it. A name the primitive has no implementation of is E043 with
``fallback=false`` and W012 (the default kept) with ``fallback=true``: the frontend reports both at
the annotation, and ``mdsl-lower-to-sched`` raises E043 again for IR that did not come through it.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import ArrayAttr
from xdsl.ir import Block, Operation

from modeldsl.diagnostics import Diagnostic, DiagnosticError, DiagnosticSink, Span
from modeldsl.dialects.annotations import KernelAttr, find_annotation
from modeldsl.kernels.registry import implementations, unavailable_kernel


@dataclass(frozen=True)
class KernelChoice:
    """An available kernel an op's ``@kernel`` chose, with how binding the choice is."""

    name: str
    fallback: bool = True
    workspace: int | None = None
    autotune: bool = True


def primitive_of(op: Operation) -> str:
    return op.name.removeprefix("mdsl.graph.")


def kernel_problem(op: Operation, primitive: str | None = None) -> tuple[KernelAttr, str] | None:
    """The op's ``@kernel`` and why it cannot run the op's primitive (None when it can or there is none)."""
    attr = find_annotation(op, KernelAttr)
    if attr is None:
        return None
    problem = unavailable_kernel(primitive or primitive_of(op), attr.values["name"])
    return None if problem is None else (attr, problem)


def unavailable_diagnostic(attr: KernelAttr, problem: str, span: Span | None) -> Diagnostic:
    """E043 for a binding choice, W012 (the default kept) for one with ``fallback=true``."""
    if attr.values["fallback"]:
        return Diagnostic("W012", f"@kernel: {problem}; the default kernel runs instead", span,
                          "name one of its kernels, or drop the annotation")
    return Diagnostic("E043", f"@kernel: {problem}", span,
                      "name one of its kernels, or allow the default with fallback=true")


def check_kernel_annotation(op: Operation, span: Span | None, sink: DiagnosticSink) -> None:
    """Report (E043 or W012, at ``span``) an op's ``@kernel`` that names no kernel of its primitive."""
    found = kernel_problem(op)
    if found is not None:
        sink.add(unavailable_diagnostic(*found, span))


def kernel_choice(op: Operation, primitive: str) -> KernelChoice | None:
    """The kernel an op's ``@kernel`` chose for ``primitive``; None without one or where the name is
    no kernel of it and ``fallback=true``; E043 (at the annotation) where it is binding."""
    attr = find_annotation(op, KernelAttr)
    if attr is None:
        return None
    values = attr.values
    problem = unavailable_kernel(primitive, values["name"])
    if problem is not None:
        if values["fallback"]:
            return None
        from modeldsl.ir import span_of_annotation

        raise DiagnosticError([unavailable_diagnostic(attr, problem, span_of_annotation(op.location, "@kernel"))])
    return KernelChoice(values["name"], values["fallback"], values["workspace"], values["autotune"])


def carry_to_backward(forward: Operation, after: Operation | None, block: Block) -> None:
    """Give the ops after ``after`` in ``block`` that a VJP rule made for ``forward`` and that run
    its backward primitive (``flash_attention_backward``) the forward's ``@kernel``, where that
    names one of their kernels and they have none of their own: one choice covers both directions."""
    attr = find_annotation(forward, KernelAttr)
    op = after.next_op if after is not None else block.first_op
    while attr is not None and op is not None:
        if (op.name == f"{forward.name}_backward" and find_annotation(op, KernelAttr) is None
                and unavailable_kernel(primitive_of(op), attr.values["name"]) is None):
            old = op.attributes.get("annotations")
            op.attributes["annotations"] = ArrayAttr([*(old.data if isinstance(old, ArrayAttr) else ()), attr])
        op = op.next_op


__all__ = ["KernelChoice", "carry_to_backward", "check_kernel_annotation", "implementations", "kernel_choice",
           "kernel_problem"]
