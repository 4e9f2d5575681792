#!/usr/bin/env bash
# Installs the project on a CPU machine. torch goes first, pinned to the CPU build that a
# bare `torch` requirement would otherwise replace with a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e ".[test]"
