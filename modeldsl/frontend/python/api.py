"""The names a Python DSL file imports (``from modeldsl.dsl import module, Param, Tensor, ...``).

They let the file run as ordinary Python but compute nothing: modeldsl reads the file's source
(:mod:`modeldsl.frontend.python.translate`), never its objects, so a graph is never executed.
A decorated class keeps its name and gains its kind (``__mdsl_kind__``) and file
(``__mdsl_file__``), which ``modeldsl.load(TheClass, ...)`` lowers; calling it (``RMSNorm("d",
"eps")`` in a ``Param``) records its arguments instead of running ``__init__``. Each decorated
class is registered by kind and name (:mod:`modeldsl.frontend.python.classes`), which
``list_registered_models()`` and the other names of the compiler API
(:mod:`modeldsl.frontend.python.compiler`) read.
"""

from __future__ import annotations

import inspect
from typing import Any

from modeldsl.frontend.python import classes
from modeldsl.frontend.python.classes import ABSTRACT, FILE, KIND


class Instance:
    """A declaration called with its arguments (a submodule or stack element in a ``Param``)."""

    def __init__(self, declaration: type, args: tuple, kwargs: dict):
        self.declaration, self.args, self.kwargs = declaration, args, kwargs


def _declaration(kind: str):
    def mark(cls: type) -> type:
        setattr(cls, KIND, kind)
        try:
            setattr(cls, FILE, inspect.getsourcefile(cls))
        except (OSError, TypeError):  # defined in `python -c` or an interactive session: no file to read
            setattr(cls, FILE, None)
        cls.__new__ = lambda klass, *args, **kwargs: Instance(klass, args, kwargs)  # type: ignore[method-assign]
        classes.REGISTERED[kind][cls.__name__] = cls
        return cls

    return mark


module, block, model = _declaration("module"), _declaration("block"), _declaration("model")


def _marker(func):
    return func


def primitive(func=None, **options: Any):
    """``@primitive(impl="kernels.x")``: a primitive's signature; ``@name.backward`` marks its backward."""
    def mark(function):
        function.backward = _marker
        return function

    return mark(func) if callable(func) else mark


forward = backward = _marker


def _names(*names: str):
    """``@save("x", "rstd")``, ``@recompute("h")``: the tensors kept for (recomputed in) the backward."""
    return _marker


save = recompute = _names


def _sections(*entries: Any, **named: Any):
    """``@hf_config(...)``, ``@hf_mapping({...})``, ``@hf_export({...})``: a model's HuggingFace sections."""
    return lambda cls: cls


class _HfMapping:
    """``@hf_mapping(name="hf.tensor", ...)`` and ``@hf_mapping.indexed("blocks", name="...{layer}...")``."""

    def __call__(self, *entries: Any, **named: Any):
        return _sections(*entries, **named)

    def indexed(self, param: str, *entries: Any, index_var: str = "layer", **named: Any):
        """The mappings of the stack ``param``'s elements, ``{layer}`` (or ``{index_var}``) its index."""
        return _sections(*entries, **named)


hf_config = hf_export = _sections
hf_mapping = _HfMapping()


class _Subscriptable:
    def __init__(self, name: str):
        self.name = name

    def __getitem__(self, dims: Any) -> tuple[str, Any]:
        return (self.name, dims)


Tensor, Array = _Subscriptable("Tensor"), _Subscriptable("Array")


class Param:
    """``Param(Tensor["out_dim", "in_dim"], when="bias")``: a parameter of the declaration."""

    def __init__(self, type_: Any, when: Any = None, **annotations: Any):
        self.type, self.when, self.annotations = type_, when, annotations


def param(func=None, **options: Any):
    """``@param def weight(self) -> Tensor[...]``, ``@param(frozen=True)``, ``@param(condition=lambda self:
    self.use_bias)``: a parameter in the method style (its name the method's, its type the return's)."""
    return func if callable(func) else _marker


class Activation:
    """``ln1_rstd = Activation(Tensor["B", "T"], dtype="fp32", save=True)``: a memory hint for a tensor
    of the forward graph (see :mod:`modeldsl.frontend.python.slots`)."""

    def __init__(self, type_: Any = None, **options: Any):
        self.type, self.options = type_, options


class Gradient:
    """``d_ln1 = Gradient(Tensor["B", "T", "C"], gradient_of="ln1")``: the gradient slot of a forward
    tensor, its type checked against that tensor's (see :mod:`modeldsl.frontend.python.slots`)."""

    def __init__(self, type_: Any = None, **options: Any):
        self.type, self.options = type_, options


class Dim:
    """``Dim("d_model")``: a dimension named by an expression of the parameters."""

    def __init__(self, expr: str):
        self.expr = expr


def _call(name: str):
    def call(*args: Any, **kwargs: Any) -> tuple[str, tuple, dict]:
        return (name, args, kwargs)

    call.__name__ = name
    return call


fuse, split, field, transform, stack_experts = (
    _call(n) for n in ("fuse", "split", "field", "transform", "stack_experts"))


class tied_to(tuple):  # noqa: N801 - spelled as the DSL's tied_to(...)
    """``Param(tied_to("embedding"))``, or ``@tied_to("embedding")`` on a ``@param`` method: a parameter
    that is another one."""

    def __new__(cls, *args: Any, **kwargs: Any):
        return super().__new__(cls, ("tied_to", args, kwargs))

    def __call__(self, function):
        return function


class _Builder:
    def __getattr__(self, name: str):
        raise RuntimeError(f"g.{name}(...) is not run: graphs of the Python DSL are read from the source; lower "
                           "the model with modeldsl.load or mdsl-opt")


class graph:  # noqa: N801 - used as `with graph() as g:`
    def __enter__(self) -> _Builder:
        return _Builder()

    def __exit__(self, *exc: Any) -> None:
        return None


def abstract(cls: type) -> type:
    """``@abstract``: a declaration to extend, not to lower."""
    setattr(cls, ABSTRACT, True)
    return cls


def extends(base: str):
    """``@extends("Base")``: inherit Base's parameters and forward signature."""
    return lambda cls: cls


def _annotation(name: str):
    """An annotation as a class decorator, bare (``@checkpoint``) or with its arguments."""
    def annotate(*args: Any, **kwargs: Any):
        if len(args) == 1 and not kwargs and isinstance(args[0], type):
            return args[0]
        return lambda cls: cls

    annotate.__name__ = name
    return annotate


def _annotation_names() -> list[str]:
    import keyword

    from modeldsl.dialects.annotations import ANNOTATION_BY_NAME

    return [n for n in ANNOTATION_BY_NAME if n.isidentifier() and not keyword.iskeyword(n) and n not in globals()]


ANNOTATIONS = _annotation_names()
globals().update({name: _annotation(name) for name in ANNOTATIONS})

B, T = Dim("B"), Dim("T")

from modeldsl.frontend.python.compiler import (  # noqa: E402 - its functions import what they need when called
    DSLError,
    compile_model,
    compile_model_for_hf,
    get_block_spec,
    get_model_spec,
    get_module_spec,
    list_registered_blocks,
    list_registered_models,
    list_registered_modules,
)

__all__ = ["module", "block", "model", "primitive", "forward", "backward", "save", "recompute", "Tensor", "Array",
           "Param", "param", "Activation", "Gradient", "Dim",
           "compile_model", "compile_model_for_hf", "get_model_spec", "get_block_spec", "get_module_spec",
           "list_registered_models", "list_registered_blocks", "list_registered_modules", "DSLError",
           "graph", "B", "T", "tied_to", "fuse", "split", "field", "transform", "stack_experts", "hf_config",
           "hf_mapping", "hf_export", "abstract", "extends", *ANNOTATIONS]
