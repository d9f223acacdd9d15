#!/usr/bin/env bash
# Everything a machine with a GPU should check, in one command, from the repository root:
#
#     bash benchmarks/gpu_check.sh            # PYTHON=... to pick the interpreter that has the gpu extra
#
# 1. the machine: GPU, driver, and which of CuPy, cuDF, RMM and dask-cuda import (the GPU backend needs
#    CuPy and cuDF; without cuDF it cannot run, and this says so instead of failing);
# 2. the API-contract tests (every cuDF / CuPy call gpu-prep makes, against the installed wheels), the
#    parity suite (the GPU backend's shards byte-identical to the CPU backend's) and the xp suite (the array
#    code on CuPy equal to numpy: it needs CuPy alone, so it runs where cuDF is missing too);
# 3. the backend benchmark: bench_pipeline.py, the CPU and the GPU backend stage by stage on its corpora;
#    bench_mask_stage.py, the mask stage inside a run and alone on each; fuzzy_dedup's band keys
#    (MinHash + LSH, gpu_prep/filter/fuzzy.py) and the JSON byte scan cuDF's reader waits on (gpu_prep/read/jsonscan.py)
#    on numpy and on CuPy.
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
import importlib, importlib.metadata, platform
print(f"- Python {platform.python_version()}")
for name in ("cupy", "cudf", "rmm", "dask_cuda", "fastokens", "tokenizers"):
    try:
        module = importlib.import_module(name)
        print(f"- {name} {getattr(module, '__version__', None) or importlib.metadata.version(name)}")
    except Exception as exc:  # noqa: BLE001  a report, not a failure
        print(f"- {name}: not importable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
from gpu_prep.backend import gpu_missing_reason
reason = gpu_missing_reason()
print(f"- CuPy sees a GPU: {'yes' if reason is None else 'no, ' + reason}")
PY
} | tee -a "$report"

tests=$(mktemp)
"$PY" -m pytest -q -p no:cacheprovider -rfEs --tb=short tests/backend/test_gpu_api_contract.py tests/backend/test_gpu_parity.py \
  tests/backend/test_gpu_xp.py > "$tests" 2>&1 \
  || status=1
{
  echo
  echo "API contract and parity (pytest; the whole log: $tests):"
  echo
  # Every failure and skip by name, then the count; the tracebacks stay in the log.
  sed -n '/short test summary info/,$p' "$tests" | grep -v "short test summary info" | sed 's/^/    /'
} | tee -a "$report"

{
  echo
  echo "Backend benchmark (python benchmarks/bench_pipeline.py --rows 2000):"
  echo
  "$PY" benchmarks/bench_pipeline.py --rows 2000 2>&1 | tail -40 | sed 's/^/    /'
} | tee -a "$report"

{
  echo
  echo "The mask stage inside a run and alone (python benchmarks/bench_mask_stage.py --chats 2000):"
  echo
  "$PY" benchmarks/bench_mask_stage.py --chats 2000 2>&1 | grep -v "^--device gpu" | sed 's/^/    /'
} | tee -a "$report"

{
  echo
  echo "fuzzy_dedup band keys, numpy beside CuPy (20,000 synthetic documents, 128 permutations, 9 x 13 bands):"
  echo
  "$PY" - <<'PY' 2>&1 | sed 's/^/    /'
import sys, time
sys.path.insert(0, "tests")
import numpy as np
from test_gpu_xp import _texts
from gpu_prep.backend import CPU, GpuBackend
from gpu_prep.filter.fuzzy import MinHasher, text_band_keys
texts = _texts(20000, seed=7)
megabytes = sum(len(t.encode()) for t in texts) / 1e6
hasher = MinHasher(5, 128, 9, 13, 42)
backends = [CPU]
try:
    import cupy
    if cupy.is_available():
        backends.append(GpuBackend("gpu", cupy))  # the array code alone: no cuDF needed
except ImportError:
    pass
keys = {}
for backend in backends:
    text_band_keys(backend, hasher, texts[:200])  # warm: kernels compiled, memory pooled
    started = time.perf_counter()
    keys[backend.name] = text_band_keys(backend, hasher, texts)[0]  # on the host when it returns
    seconds = time.perf_counter() - started
    print(f"{backend.name}: {seconds:.3f} s, {len(texts) / seconds:,.0f} docs/s, {megabytes / seconds:.1f} MB/s")
if len(keys) == 2:
    print("same keys on both:", bool((keys["cpu"] == keys["gpu"]).all()))
PY
} | tee -a "$report"

{
  echo
  echo "The JSON byte scan before cudf.read_json (gpu_prep/read/jsonscan.py), numpy beside CuPy (10,000 ShareGPT chats):"
  echo
  "$PY" - <<'PY' 2>&1 | sed 's/^/    /'
import json, sys, time
sys.path.insert(0, ".")
import numpy as np
from benchmarks.corpora import sharegpt_chats
from gpu_prep.read.jsonscan import scan
chats = [json.dumps({"messages": c["messages"]}, ensure_ascii=False).encode() for c in sharegpt_chats(10000)]
ranges, size = [[]], 0  # ranges of about 16 MiB of whole lines, as read.py hands them over
for line in chats:
    ranges[-1].append(line)
    size += len(line) + 1
    if size >= 16 << 20:
        ranges.append([])
        size = 0
blocks = [(b"\n".join(r) + b"\n", len(r)) for r in ranges if r]
values = {"messages": (91, True), "role": (34, False), "content": (34, False)}
modules = [np]
try:
    import cupy
    if cupy.is_available():
        modules.append(cupy)
except ImportError:
    pass
found = {}
for xp in modules:
    head = blocks[0][0][:100000].rsplit(b"\n", 1)[0] + b"\n"
    scan(xp, head, head.count(b"\n"), values)  # warm: kernels compiled
    started = time.perf_counter()
    found[xp.__name__] = [scan(xp, block, rows, values) for block, rows in blocks]  # each ends synchronised
    seconds = time.perf_counter() - started
    megabytes = sum(len(b) for b, _ in blocks) / 1e6
    print(f"{xp.__name__}: {seconds:.3f} s for {megabytes:.1f} MB ({megabytes / seconds:,.0f} MB/s), keys {found[xp.__name__]}")
if len(found) == 2:
    print("same answers on both:", found["numpy"] == found["cupy"])
PY
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
