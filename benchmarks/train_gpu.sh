#!/bin/bash
# Training throughput on one GPU, side by side in one run: aiayn's training step as `aiayn train`
# runs it (eager, and `--compile`) against the peer a GPU user would pick without installing
# anything, torch.nn.Transformer in its best configuration (PyTorch's own cross-entropy, fused
# Adam, eager and torch.compile'd), each in bf16 autocast, for the paper's base and big models at
# WMT's sizes: a 37,000-id shared vocabulary and the paper's 25,000-token updates (one pass each,
# memory allowing), source lengths uniform in 10..60 (random ids). Also the GPU's measured bf16
# matmul peak. One JSON line per row in $OUT/train_gpu.jsonl and a markdown table in
# $OUT/train_gpu.md (benchmarks/gpu_table.py) naming the GPU, driver, torch and the commit (clean or
# not); MFU is against the measured peak and PEAK_TFLOPS (default: the H100 SXM's dense bf16 989.4).
#
#     OUT=runs/gpu bash benchmarks/train_gpu.sh          # python3 with torch+CUDA, from the repo root
#     COMPILE=0 OUT=runs/gpu bash benchmarks/train_gpu.sh  # the eager rows only
#     EAGER=0 COMPILE_CONFIGS=base ...                   # the compiled rows of base only
#     ONLY=aiayn ...                                     # one system's rows only
#     ROW_SECONDS=120 ...                                # each row's time cap (default 150)
#     LEVER_CONFIGS="base big" ...  # the models that also get aiayn's eager-loss row (default
#                                   # base): what the compiled loss buys; "" for none
set -uo pipefail
OUT=${OUT:-runs/gpu}
PEAK=${PEAK_TFLOPS:-989.4}
PY=${PYTHON:-python3}
CAP=${ROW_SECONDS:-150}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 AIAYN_ALLOCATOR=system
mkdir -p "$OUT"
J=$OUT/train_gpu.jsonl
: > "$J"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

# the matmul peak this GPU sustains (8192^3 bf16, median of 20 after warm-up)
$PY - <<'EOF' | tee -a "$J"
import json, statistics, sys, torch
sys.path.insert(0, "benchmarks")
from provenance import stamp  # the commit, whether the tree was clean, the host's CPU
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
for _ in range(5): a @ b
times = []
for _ in range(20):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); a @ b; e.record(); torch.cuda.synchronize(); times.append(s.elapsed_time(e) / 1e3)
print(json.dumps({"system": "matmul", "shape": [8192, 8192, 8192], "dtype": "bf16",
                  "tflops": round(2 * 8192**3 / statistics.median(times) / 1e12, 1),
                  "torch": torch.__version__, "gpu": torch.cuda.get_device_name(), **stamp()}))
EOF

COMMON=(--device cuda --precision bf16 --vocab 37000 --max-tokens 25000 --lengths 10 60 --pairs 6000
        --windows 3 --steps 4 --peak-tflops "$PEAK" --json)
# eager rows first, the compiled ones (a minute or more of compiling each) after them, each row
# capped at CAP seconds; EAGER=0 or COMPILE=0 leaves one kind out, COMPILE_CONFIGS which models
# the compiled rows measure (default both)
RUNS=()
[ "${EAGER:-1}" = 1 ] && RUNS+=("torch" "aiayn" "aiayn --eager-loss")
[ "${COMPILE:-1}" = 1 ] && RUNS+=("aiayn --compile --warmup 12" "torch --compile --warmup 12")
for run in "${RUNS[@]}"; do
  [ -n "${ONLY:-}" ] && [ "${run%% *}" != "$ONLY" ] && continue
  configs="base big"
  [[ "$run" == *--compile* ]] && configs=${COMPILE_CONFIGS:-base big}
  [[ "$run" == *--eager-loss* ]] && configs=${LEVER_CONFIGS-base}
  for config in $configs; do
    echo "== $config: $run" >&2
    # shellcheck disable=SC2086
    timeout "$CAP" $PY benchmarks/train_systems.py --system $run --config $config "${COMMON[@]}" \
      | tee -a "$J" || echo "{\"system\": \"${run%% *}\", \"config\": \"$config\", \"failed\": \"$run: exit $? (cap ${CAP}s)\"}" | tee -a "$J"
  done
done
$PY benchmarks/gpu_table.py "$J" "$PEAK" > "$OUT/train_gpu.md"; cat "$OUT/train_gpu.md"
