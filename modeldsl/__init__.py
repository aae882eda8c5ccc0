"""modeldsl: a compiler toolchain for neural networks written in the Module DSL.

The import root. ``modeldsl.dialects`` holds the ``mdsl.graph`` and
``mdsl.sched`` dialects, ``modeldsl.passes`` the passes, ``modeldsl.kernels``
the kernels and ``modeldsl.tools`` the command-line drivers.
"""

__version__ = "0.1.0"


def load(model_file=None, hf=None, dtype="fp32", **options):
    """Load a Module DSL model, with a HuggingFace checkpoint's weights (see
    :func:`modeldsl.runtime.model.load`); without a model file, the std model that serves the
    checkpoint's architecture (:mod:`modeldsl.registry`)."""
    from modeldsl.runtime.model import load as _load

    return _load(model_file, hf=hf, dtype=dtype, **options)


def __getattr__(name):
    """``modeldsl.verify_backward(model, weights, inputs, ...)``: the finite-difference oracle of
    a model's derived gradient (:func:`modeldsl.verify_backward.verify_backward`). The attribute
    is the submodule ``modeldsl.verify_backward``, which is callable, so it stays callable once
    anything imports the submodule."""
    if name == "verify_backward":
        import importlib

        return importlib.import_module("modeldsl.verify_backward")
    raise AttributeError(f"module 'modeldsl' has no attribute '{name}'")
