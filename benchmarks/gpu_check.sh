#!/usr/bin/env bash
# Everything a machine with a GPU should check, in one command, from the repository root:
#
#     bash benchmarks/gpu_check.sh            # PYTHON=... to pick the interpreter that has the gpu extra
#
# 1. the machine: GPU, driver, and which of CuPy, cuDF, RMM and dask-cuda import (the GPU backend needs
#    CuPy and cuDF; without cuDF it cannot run, and this says so instead of failing);
# 2. the API-contract tests (every cuDF / CuPy call gpu-prep makes, against the installed wheels) and the
#    parity suite (the GPU backend's shards byte-identical to the CPU backend's);
# 3. the backend benchmark: bench_pipeline.py, the CPU and the GPU backend stage by stage on its corpora.
#
# The report goes to the terminal and, where CuPy sees a GPU, is appended to benchmarks/RESULTS.md under a
# heading that names the machine and the day. The script exits non-zero when a test failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
report=$(mktemp)
status=0

{
  gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
  echo
  echo "## GPU check ($(date -u +%F), ${gpu:-no nvidia-smi}, $(nproc) CPU cores)"
  echo
  echo "    bash benchmarks/gpu_check.sh"
  echo
  "$PY" - <<'PY'
import importlib, platform
print(f"- Python {platform.python_version()}")
for name in ("cupy", "cudf", "rmm", "dask_cuda", "fastokens", "tokenizers"):
    try:
        module = importlib.import_module(name)
        print(f"- {name} {getattr(module, '__version__', '?')}")
    except Exception as exc:  # noqa: BLE001  a report, not a failure
        print(f"- {name}: not importable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
from gpu_prep.backend import gpu_missing_reason
reason = gpu_missing_reason()
print(f"- CuPy sees a GPU: {'yes' if reason is None else 'no, ' + reason}")
PY
} | tee -a "$report"

tests=$(mktemp)
"$PY" -m pytest -q -p no:cacheprovider -rs tests/test_gpu_api_contract.py tests/test_gpu_parity.py > "$tests" 2>&1 \
  || status=1
{
  echo
  echo "API contract and parity (pytest):"
  echo
  tail -25 "$tests" | sed 's/^/    /'
} | tee -a "$report"
rm -f "$tests"

{
  echo
  echo "Backend benchmark (python benchmarks/bench_pipeline.py --rows 2000):"
  echo
  "$PY" benchmarks/bench_pipeline.py --rows 2000 2>&1 | tail -40 | sed 's/^/    /'
} | tee -a "$report"

# A machine where CuPy sees no GPU has nothing to record (GPU_CHECK_APPEND=1 records it all the same).
if grep -q "^- CuPy sees a GPU: yes" "$report" || [ "${GPU_CHECK_APPEND:-0}" = 1 ]; then
  cat "$report" >> benchmarks/RESULTS.md
  echo; echo "appended to benchmarks/RESULTS.md (exit $status)"
else
  echo; echo "no GPU seen: nothing appended to benchmarks/RESULTS.md (exit $status)"
fi
rm -f "$report"
exit $status
