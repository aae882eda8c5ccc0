"""modeldsl: a compiler toolchain for neural networks written in the Module DSL.

The import root. ``modeldsl.dialects`` holds the ``mdsl.graph`` and
``mdsl.sched`` dialects, ``modeldsl.passes`` the passes, ``modeldsl.kernels``
the kernels and ``modeldsl.tools`` the command-line drivers.
"""

__version__ = "0.1.0"
