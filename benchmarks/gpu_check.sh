#!/usr/bin/env bash
# One-shot GPU check for the batched selection engine (issue 4), for a bare CUDA host that has
# python, torch (CUDA build) and triton, and maybe nothing else: no network, no pip installs,
# faiss / bm25s / nltk / numba / pytest optional. Run from anywhere:
#
#     bash benchmarks/gpu_check.sh            # JSON to $OUT, else $TRAWMEM_BENCH_OUT, else benchmarks/results/
#     python -m benchmarks run gpu_check      # the same, through the suite's runner
#
# Steps (each under its own timeout; the whole script stays under ~5 minutes):
#   1. environment: GPU, versions, which optional modules import (faiss, faiss GPUs, bm25s, ...)
#   2. makes `trawmem_gpu` importable without installing anything (the repository root on PYTHONPATH
#      when the package is not installed)
#   3. the CUDA tests: pytest -k "cuda or triton" over tests/select/agreement/test_kernels_*.py, test_engine.py,
#      test_engine_scale.py, test_objective.py (the Triton greedy against J term by term)
#      (skipped with a note when pytest is missing)
#   4. the GPU benchmark: bench_select.py --gpu-target (U = 145, B = 16, d = 384, large Q):
#      selections/s of the device stages, end-to-end queries/s, bytes moved / time vs 4.3 TB/s;
#      without bm25s it runs the dense-affinity config and says so
#   4b. optional, with TRAWMEM_GPU_LLM=/local/model/dir and vllm installed: every LLM path on that model
#      through the offline vLLM engine (structured outputs), `real_llm paths --label gpu-vllm` (15 min cap;
#      benchmarks/results/real_llm.md says what it should show)
#   5. a short summary, and gpu_check.json (environment, test outcome, benchmark file)
#
# A bare host lacks three small packages the default selection needs; carry them as wheels (see
# benchmarks/results/gpu/README.md): bm25s and PyStemmer (BM25, the default affinity) and bpe-openai
# (the token counter: tiktoken cannot download cl100k_base offline). Without them the benchmark runs
# the dense affinity and says so; without bpe-openai the engine cannot count tokens.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUTDIR="${OUT:-${TRAWMEM_BENCH_OUT:-$ROOT/benchmarks/results}}"
mkdir -p "$OUTDIR"
PY="${PYTHON:-python3}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset TRITON_INTERPRET  # compiled kernels on the GPU
T0=$(date +%s)

echo "== 1. environment"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" - "$OUTDIR/gpu_check_env.json" <<'EOF'
import importlib, json, platform, sys
env = {"python": platform.python_version(), "platform": platform.platform()}
for m in ("torch", "triton", "numpy", "faiss", "bm25s", "nltk", "numba", "pytest", "apricot"):
    try:
        mod = importlib.import_module(m)
        env[m] = getattr(mod, "__version__", "present")
    except Exception as e:  # noqa: BLE001
        env[m] = None
try:
    import torch
    env["cuda"] = torch.cuda.is_available()
    env["device"] = torch.cuda.get_device_name(0) if env["cuda"] else None
    env["torch_cuda"] = torch.version.cuda
except Exception as e:  # noqa: BLE001
    env["cuda"] = False
    env["torch_error"] = repr(e)
if env.get("faiss"):
    import faiss
    env["faiss_gpus"] = int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0
print(json.dumps(env))
json.dump(env, open(sys.argv[1], "w"), indent=1)
EOF

echo "== 2. package import"
# asked from / (from the root, `python -c` would find the checkout by the current directory alone,
# and a script run as a file would not)
if ! (cd / && "$PY" -c "import trawmem_gpu.kernels.greedy") >/dev/null 2>&1 || [ -n "${GPU_CHECK_OVERLAY:-}" ]; then
  # the package sits at the repository root (its kernels inside it, trawmem_gpu/kernels/): the root
  # first on PYTHONPATH is all an uninstalled checkout needs; nothing is written into the tree
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  echo "trawmem_gpu not installed: importing it from $ROOT"
fi
"$PY" -c "import trawmem_gpu.select.engine, trawmem_gpu.kernels.greedy, trawmem_gpu.kernels.priority; print('imports ok')" \
  || echo "WARNING: engine or kernel import failed (see above)"

echo "== 3. CUDA tests"
TESTS_RC=-1
if "$PY" -c "import pytest" >/dev/null 2>&1; then
  timeout 170 "$PY" -m pytest -q -p no:cacheprovider -k "cuda or triton" -rs \
    tests/select/agreement/test_kernels_priority.py tests/select/agreement/test_kernels_greedy.py tests/select/agreement/test_engine.py tests/select/agreement/test_engine_scale.py tests/select/agreement/test_objective.py 2>&1 | tail -25
  TESTS_RC=${PIPESTATUS[0]}
  echo "pytest exit code: $TESTS_RC (124 = timed out)"
else
  echo "pytest not installed: CUDA tests NOT run"
fi

echo "== 4. GPU benchmark"
# the script's file (benchmarks/_boot.py runs it as benchmarks.bench_select): whichever trawmem_gpu comes
# first on the path is the one measured
timeout 200 "$PY" benchmarks/bench_select.py --gpu-target --out-dir "$OUTDIR" 2>&1 | grep -v -i warn | tail -20
BENCH_RC=${PIPESTATUS[0]}
echo "benchmark exit code: $BENCH_RC (124 = timed out)"

echo "== 4b. a real LLM on the GPU (only with TRAWMEM_GPU_LLM=/path/to/a/local/model and vllm installed)"
if [ -n "${TRAWMEM_GPU_LLM:-}" ] && "$PY" -c "import vllm" >/dev/null 2>&1; then
  TRAWMEM_BENCH_OUT="$OUTDIR" timeout 900 "$PY" -m benchmarks run real_llm paths --url "vllm:$TRAWMEM_GPU_LLM" \
    --label gpu-vllm --model "$TRAWMEM_GPU_LLM (vLLM offline)" --only "segment,facts,update,plan-trawmem,plan-trimem,eval" \
    || echo "real-LLM paths: exit $? (see $OUTDIR/real_llm_paths.json)"
else
  echo "skipped: set TRAWMEM_GPU_LLM to a local model directory (vllm offline) to run every LLM path on it"
fi

echo "== 5. summary ($(( $(date +%s) - T0 ))s)"
"$PY" - "$OUTDIR" "$TESTS_RC" "$BENCH_RC" "$(( $(date +%s) - T0 ))" <<'EOF'
import json, os, sys
out, tests_rc, bench_rc, wall = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
env = json.load(open(os.path.join(out, "gpu_check_env.json")))
summary = {"env": env, "cuda_tests_exit_code": tests_rc, "benchmark_exit_code": bench_rc, "wall_s": wall}
p = os.path.join(out, "select_gpu.json")
if os.path.exists(p):
    g = json.load(open(p)).get("gpu_target", {})
    summary["gpu_target"] = g
    if g.get("skipped"):
        print("GPU benchmark:", g["skipped"])
    for r in g.get("runs", []):
        if "error" in r:
            print(f"  {r['impl']} Q={r.get('Q')}: ERROR {r['error'][:160]}")
        else:
            print(f"  {r['impl']:6s} Q={r['Q']:>6}: device {r['device_selections_per_s']:>12,.0f} selections/s "
                  f"({r['bandwidth_fraction']:.2%} of 4.3 TB/s by the byte model), end-to-end "
                  f"{r['end_to_end_qps']:>9,.0f} q/s, U~{r['U_mean']:.0f}")
print(f"faiss: {env.get('faiss')} (GPUs: {env.get('faiss_gpus', 0)}), bm25s: {env.get('bm25s')}, "
      f"CUDA tests rc={tests_rc}, benchmark rc={bench_rc}, {wall}s")
json.dump(summary, open(os.path.join(out, "gpu_check.json"), "w"), indent=1, default=str)
print("wrote", os.path.join(out, "gpu_check.json"))
EOF
