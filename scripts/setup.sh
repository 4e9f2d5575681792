#!/usr/bin/env bash
# Installs the project on a CPU machine into the active Python (a virtual environment, see the
# README). torch goes first, pinned to the CPU build that a bare `torch` requirement would
# otherwise replace with a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' && [ -z "${CONDA_PREFIX:-}" ]; then
    echo "setup.sh: no virtual environment is active; installing into $(python3 -c 'import sys; print(sys.prefix)')" \
         "(see the README: python3 -m venv .venv && . .venv/bin/activate)" >&2
fi
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e ".[test]"
