"""Package discovery; all other metadata lives in pyproject.toml.

The Triton kernels live in `trawmem_gpu/kernels/`. They sat at the repository root once, installed
as `trawmem_gpu.kernels` through a `package-dir` mapping, but a top-level `kernels` folder is found
by `import kernels` whenever the repository root is on `sys.path` (`python -m pytest`, a notebook
opened there), and transformers imports the unrelated PyPI `kernels` package by that name.
"""
from setuptools import find_packages, setup

setup(packages=find_packages(include=["trawmem_gpu", "trawmem_gpu.*"]))
