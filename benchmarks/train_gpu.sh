#!/bin/bash
# Training throughput on one GPU, side by side in one run: aiayn's training step (eager and
# `--compile`) and the peer a user would pick instead on a GPU without installing anything,
# torch.nn.Transformer, each in bf16 autocast, for the paper's base and big models at WMT's sizes:
# a 37,000-id shared vocabulary and micro-batches of 12,500 tokens per side (the paper's
# 25,000-token update is two of them; scripts/wmt14.sh runs it so), source lengths uniform in
# 10..60 (random ids). Also the GPU's measured bf16 matmul peak. One JSON line per row in
# $OUT/train_gpu.jsonl; MFU is against PEAK_TFLOPS (default: the H100 SXM's dense bf16 989.4).
#
#     OUT=runs/gpu bash benchmarks/train_gpu.sh          # python3 with torch+CUDA, from the repo root
#     COMPILE=0 OUT=runs/gpu bash benchmarks/train_gpu.sh  # the eager rows only
set -euo pipefail
OUT=${OUT:-runs/gpu}
PEAK=${PEAK_TFLOPS:-989.4}
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
J=$OUT/train_gpu.jsonl
: > "$J"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

# the matmul peak this GPU sustains (8192^3 bf16, median of 20 after warm-up)
$PY - <<'EOF' | tee -a "$J"
import json, statistics, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
for _ in range(5): a @ b
times = []
for _ in range(20):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); a @ b; e.record(); torch.cuda.synchronize(); times.append(s.elapsed_time(e) / 1e3)
print(json.dumps({"system": "matmul", "shape": [8192, 8192, 8192], "dtype": "bf16",
                  "tflops": round(2 * 8192**3 / statistics.median(times) / 1e12, 1),
                  "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}))
EOF

COMMON=(--device cuda --precision bf16 --vocab 37000 --max-tokens 12500 --lengths 10 60 --pairs 6000
        --windows 3 --steps 5 --peak-tflops "$PEAK" --json)
# eager rows first, the compiled ones (a minute or more of compiling each) after them;
# COMPILE=0 leaves the compiled rows out
RUNS=("torch" "aiayn")
[ "${COMPILE:-1}" = 1 ] && RUNS+=("aiayn --compile --warmup 30")
for run in "${RUNS[@]}"; do
  for config in base big; do
    echo "== $config: $run" >&2
    # shellcheck disable=SC2086
    AIAYN_ALLOCATOR=system $PY benchmarks/train_systems.py --system $run --config $config "${COMMON[@]}" \
      | tee -a "$J"
  done
done
