#!/usr/bin/env bash
# The test command (README): installs the package with its test extra (scripts/setup.sh --test,
# into .venv or the active virtual environment), then runs the whole suite on the CPU. Triton
# kernels run under TRITON_INTERPRET=1 (tests/conftest.py); CUDA tests skip cleanly without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/python_env.sh
bash scripts/setup.sh --test
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python3 -m pytest tests -q -p no:cacheprovider "$@"
