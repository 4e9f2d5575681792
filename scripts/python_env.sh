# Sourced by scripts/setup.sh and scripts/test.sh: picks the Python they install into and run.
#   - an active virtual environment (or conda env) is used as it is;
#   - otherwise ./.venv is activated when it exists (the README's first command creates it), so
#     the scripts work in a fresh shell;
#   - otherwise they stop, unless TRAWMEM_ALLOW_SYSTEM_PYTHON=1 says to install into the
#     system Python (recent Debian / Ubuntu refuse that anyway: "externally managed").
_trawmem_in_venv() {
    [ -n "${CONDA_PREFIX:-}" ] || python3 -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' 2>/dev/null
}
if ! _trawmem_in_venv; then
    if [ -f .venv/bin/activate ]; then
        # shellcheck disable=SC1091
        . .venv/bin/activate
        echo "$(basename "$0"): using the virtual environment .venv" >&2
    elif [ "${TRAWMEM_ALLOW_SYSTEM_PYTHON:-0}" = 1 ]; then
        echo "$(basename "$0"): TRAWMEM_ALLOW_SYSTEM_PYTHON=1: installing into $(python3 -c 'import sys; print(sys.prefix)')" >&2
    else
        echo "$(basename "$0"): no virtual environment is active and there is no .venv here; create one first:" \
             "python3 -m venv .venv (the scripts then use it), or set TRAWMEM_ALLOW_SYSTEM_PYTHON=1 to install into" \
             "$(python3 -c 'import sys; print(sys.prefix)')" >&2
        exit 2
    fi
fi
