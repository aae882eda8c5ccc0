"""The command-line drivers: ``mdsl-opt`` (and, from later issues, ``mdsl-run``, ``mdsl-build-kernels``)."""
