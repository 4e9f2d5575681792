"""Checks the installed torch build against the machine (scripts/setup.sh runs it).

``python3 scripts/check_torch.py GPU`` with GPU 1 on a host with an NVIDIA GPU, else 0: on a
machine without one, a CUDA build (``torch.version.cuda`` set, or ``+cu`` in the version) is a
multi-GB mistake and stops the set-up with exit status 1 and what to do.
"""
import sys


def main(argv: list[str]) -> int:
    import torch

    gpu = argv[:1] == ["1"]
    cuda = torch.version.cuda
    print(f"setup.sh: torch {torch.__version__} ({'CUDA ' + cuda if cuda else 'CPU'} build)")
    if not gpu and (cuda is not None or "+cu" in torch.__version__):
        print(f"setup.sh: ERROR: torch {torch.__version__} is a CUDA build on a machine without an NVIDIA GPU; "
              "remove it (pip uninstall torch, and the nvidia-* packages: pip list | grep nvidia-) and rerun "
              "with PyTorch's CPU index (https://download.pytorch.org/whl/cpu) or a CPU wheel reachable",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
