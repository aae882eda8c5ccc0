"""Kernels: CUDA sources, their cubin build, the kernel registry and numpy reference kernels."""
