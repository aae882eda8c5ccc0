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


def train(model, data, **options):
    """A training run of ``model`` (a checkpoint folder or a loaded model) on ``data``: ``run()``,
    ``step()``, ``evaluate()``, ``save(OUT)`` (see :func:`modeldsl.runtime.training_run.train`)."""
    from modeldsl.runtime.training_run import train as _train

    return _train(model, data, **options)


# the user primitives' API (modeldsl.prims.user): a numpy function registered as a primitive
USER_PRIMITIVES = ("register_primitive", "unregister_primitive", "registered_primitives", "TensorSpec")
COMPILER = ("compile_model", "compile_model_for_hf", "get_model_spec", "get_block_spec", "get_module_spec",
            "list_registered_models", "list_registered_blocks", "list_registered_modules", "DSLError")


def __getattr__(name):
    """``modeldsl.verify_backward(model, weights, inputs, ...)``: the finite-difference oracle of
    a model's derived gradient (:func:`modeldsl.verify_backward.verify_backward`). The attribute
    is the submodule ``modeldsl.verify_backward``, which is callable, so it stays callable once
    anything imports the submodule. ``modeldsl.compile_model`` and the other names of the Python
    DSL's compiler API (:mod:`modeldsl.frontend.python.compiler`) load it when first asked for, and
    ``modeldsl.register_primitive`` (with ``unregister_primitive``, ``registered_primitives`` and
    ``TensorSpec``) the user primitives' registry, :mod:`modeldsl.prims.user`."""
    import importlib

    if name == "verify_backward":
        return importlib.import_module("modeldsl.verify_backward")
    if name in USER_PRIMITIVES:
        return getattr(importlib.import_module("modeldsl.prims.user"), name)
    if name in COMPILER:
        return getattr(importlib.import_module("modeldsl.frontend.python.compiler"), name)
    raise AttributeError(f"module 'modeldsl' has no attribute '{name}'")
