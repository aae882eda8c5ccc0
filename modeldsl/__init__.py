"""modeldsl: a compiler toolchain for neural networks written in the Module DSL.

The import root. ``modeldsl.dialects`` holds the ``mdsl.graph`` and
``mdsl.sched`` dialects, ``modeldsl.passes`` the passes, ``modeldsl.kernels``
the kernels and ``modeldsl.tools`` the command-line drivers.
"""

__version__ = "0.1.0"


def load(model_file, hf=None, dtype="fp32", **options):
    """Load a Module DSL model, with a HuggingFace checkpoint's weights (see
    :func:`modeldsl.runtime.model.load`)."""
    from modeldsl.runtime.model import load as _load

    return _load(model_file, hf=hf, dtype=dtype, **options)
