#!/usr/bin/env bash
# Installs the project (editable) into the virtual environment that scripts/python_env.sh picks:
#   bash scripts/setup.sh          the core package: what `trawmem demo`, build, eval, score need
#   bash scripts/setup.sh --test   plus the test extra (serve, Ray, ONNX Runtime, pytest, ...)
# torch goes first, and stays the build installed here: on a machine without an NVIDIA GPU the
# CPU build, from PyTorch's CPU wheel index when that is reachable (a bare `torch` requirement
# resolves to the CUDA build and ~3 GB of nvidia-* wheels on PyPI for Linux), else from the
# configured index (e.g. a local wheel directory); the installed build is then checked, and
# the package's own requirements are resolved with torch held at that build (a constraints file).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/python_env.sh

TORCH_VERSION=2.13.0
TORCH_CPU_INDEX=${TRAWMEM_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
target=.
case "${1:-}" in
    "") ;;
    --test) target=".[test]" ;;
    *) echo "setup.sh: unknown option '$1' (known: --test)" >&2; exit 2 ;;
esac

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    gpu=1  # a CUDA host: the default (CUDA) build is the right one
else
    gpu=0
fi
if python3 -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
    echo "setup.sh: torch $(python3 -c 'import torch; print(torch.__version__)') already installed"
elif [ "$gpu" = 1 ]; then
    python3 -m pip install -q "torch==$TORCH_VERSION"
elif [ "$(uname -s)" = Linux ] && python3 - "$TORCH_CPU_INDEX" <<'PY'
import sys, urllib.request
try:  # a quick reachability probe: offline machines fall back to the configured index
    urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=5).close()
except Exception:
    sys.exit(1)
PY
then
    echo "setup.sh: torch $TORCH_VERSION (CPU build) from $TORCH_CPU_INDEX"
    python3 -m pip install -q "torch==$TORCH_VERSION+cpu" --extra-index-url "$TORCH_CPU_INDEX"
else
    echo "setup.sh: $TORCH_CPU_INDEX not reachable; torch==$TORCH_VERSION from the configured index"
    python3 -m pip install -q "torch==$TORCH_VERSION"
fi

# check the build: a CUDA torch on a machine without a GPU is a multi-GB mistake, stop loudly
python3 -W ignore::UserWarning scripts/check_torch.py "$gpu"  # (torch warns when numpy is not there yet)

constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
python3 -W ignore::UserWarning -c 'import torch; print("torch==" + torch.__version__)' > "$constraints"
python3 -m pip install -q -c "$constraints" -e "$target"
if [ "$gpu" = 0 ] && python3 -m pip list 2>/dev/null | grep -qi '^nvidia-'; then
    echo "setup.sh: ERROR: nvidia-* packages got installed on a machine without a GPU:" \
         "$(python3 -m pip list 2>/dev/null | grep -i '^nvidia-' | cut -d' ' -f1 | tr '\n' ' ')" >&2
    exit 1
fi
echo "setup.sh: installed $target into $(python3 -c 'import sys; print(sys.prefix)')"
