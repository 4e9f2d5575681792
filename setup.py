"""Package discovery; all other metadata lives in pyproject.toml.

`kernels/` sits at the repository root (the design card's layout) but installs as
`trawmem_gpu.kernels` (see `package-dir` in pyproject.toml): a top-level package named
`kernels` would clash with an unrelated project on PyPI.
"""
from setuptools import find_packages, setup

setup(packages=find_packages(include=["trawmem_gpu", "trawmem_gpu.*"]) + ["trawmem_gpu.kernels"])
