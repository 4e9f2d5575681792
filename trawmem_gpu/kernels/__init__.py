"""Triton kernels, installed as ``trawmem_gpu.kernels``.

Each kernel sits behind a dispatcher in ``trawmem_gpu.select`` whose native torch path is the
specification, the fallback, and the test oracle.
"""
