#!/bin/bash
# Everything one short GPU loan measures, in one run that ends by itself within BUDGET seconds
# (default 540), most telling first, so that whatever the time allows comes back:
#   1. tools/gpu_micro.py, the microbenchmark that decides the step's redesign: attention
#      masked against packed varlen and equal-length buckets, the loss against
#      linear_cross_entropy's chunks, the step eager against CUDA graphs, base and big at
#      WMT-like lengths (or MICRO_DATA, a dataset directory made by `aiayn prepare`), 37,000 ids,
#      25,000-token updates, within MICRO_SECONDS (default 170);
#   2. benchmarks/train_gpu.sh's eager rows (the matmul peak; aiayn and torch.nn.Transformer, base
#      and big, 25,000-token updates, 37,000 ids), each row capped at 90 s; LEVERS=base adds
#      aiayn's row with the eager loss (what the compiled loss buys);
#   3. the compiled rows of base, aiayn's (`aiayn train --compile`) then torch.nn.Transformer's,
#      each layer compiled, each capped at COMPILE_SECONDS (default 150);
#   4. benchmarks/gpu_e2e.sh: the WMT user's pipeline (torchrun train killed once and resumed,
#      average, translate, evaluate) on the Multi30k files carried in DATA, MINUTES of training;
#   5. benchmarks/profile_step.py on the GPU: where aiayn's base step spends the GPU's time, and
#      how busy the GPU is (host-bound or not), capped at PROFILE_SECONDS (default 45);
#   6. aiayn's compiled row of big, in whatever time is left.
# On one H100 (2026-11-27) the eager rows took 171 s (with the eager-loss row), aiayn's compiled
# base row 104 s, the pipeline 131 s and the profile 33 s; compiled whole, neither model's row
# finished compiling in 140-160 s (2026-11-26 and 27), hence the per-layer compile of both.
# Wheels in .whl (carried) are installed first: the GPU machine's Python lacked sacremoses, which
# `aiayn evaluate` needs (docs/experiments/wmt.md).
# Results in $OUT: gpu.tgz (every log and JSON line, refreshed after each part, so a run cut short
# still returns what it finished), micro.json and micro.md (gpu_micro.py's rows and table),
# train_gpu.md (the table of every row), e2e.txt, profile.txt.
#
#     OUT=runs/gpu DATA=runs/gpu-carry/multi30k bash benchmarks/gpu_session.sh
set -uo pipefail
OUT=${OUT:-runs/gpu-session}
DATA=${DATA:-runs/gpu-carry/multi30k}
PEAK=${PEAK_TFLOPS:-989.4}
PY=${PYTHON:-python3}
END=$((SECONDS + ${BUDGET:-540}))
if compgen -G ".whl/*.whl" > /dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 AIAYN_ALLOCATOR=system
W=$(mktemp -d)
mkdir -p "$OUT"
left() { echo $((END - SECONDS)); }
snap() {
  cat "$W"/train_*/train_gpu.jsonl 2>/dev/null > "$W/rows.jsonl"
  $PY benchmarks/gpu_table.py "$W/rows.jsonl" "$PEAK" > "$OUT/train_gpu.md" 2>/dev/null
  cp "$W/profile.txt" "$OUT/" 2>/dev/null; cp "$W/e2e/e2e.txt" "$OUT/" 2>/dev/null
  cp "$W/micro.json" "$W/micro.md" "$OUT/" 2>/dev/null
  tar czf "$OUT/gpu.tgz.part" -C "$W" --exclude=work . && mv "$OUT/gpu.tgz.part" "$OUT/gpu.tgz"
}
log() { echo "== $* ($(left) s left)" | tee -a "$W/session.log" >&2; }

# compiled rows ("SYSTEM CONFIG" ...), each capped at COMPILE_SECONDS and the time left
compiled_rows() {
  for row in "$@"; do
    cap=$(( $(left) - 15 ))
    [ "$cap" -ge 60 ] || break
    cap=$(( cap < ${COMPILE_SECONDS:-150} ? cap : ${COMPILE_SECONDS:-150} ))
    set -- $row
    log "$1's compiled row of $2, $cap s"
    EAGER=0 COMPILE_CONFIGS=$2 ONLY=$1 ROW_SECONDS=$cap OUT=$W/train_compiled_$1_$2 \
      timeout "$((cap + 10))" bash benchmarks/train_gpu.sh > "$W/train_compiled_$1_$2.log" 2>&1
    snap
  done
}

MICRO=$(( $(left) - 30 < ${MICRO_SECONDS:-170} ? $(left) - 30 : ${MICRO_SECONDS:-170} ))
log "the design microbenchmark, $MICRO s"
timeout $((MICRO + 30)) $PY tools/gpu_micro.py --config base big --device cuda --dtype bf16 \
  --vocab 37000 --tokens 25000 --budget-s "$MICRO" --out "$W/micro.json" \
  ${MICRO_DATA:+--data "$MICRO_DATA"} > "$W/micro.md" 2> "$W/micro.log"
snap
log "eager rows"
COMPILE=0 ROW_SECONDS=90 LEVER_CONFIGS=${LEVERS-} OUT=$W/train_eager bash benchmarks/train_gpu.sh > "$W/train_eager.log" 2>&1
snap
compiled_rows "aiayn base" "torch base"
log "the WMT pipeline end to end"
DATA=$DATA OUT=$W/e2e WORK=$W/e2e/work MINUTES=${MINUTES:-0.8} timeout $(($(left) - 20)) \
  bash benchmarks/gpu_e2e.sh > "$W/e2e.log" 2>&1
rm -rf "$W/e2e/work/run/checkpoints" "$W/e2e/work/model"
snap
PROFILE=${PROFILE_SECONDS:-45}
if [ "$(left)" -ge 30 ]; then
  log "profile of aiayn's base step"
  timeout $(( $(left) < PROFILE ? $(left) - 10 : PROFILE )) $PY benchmarks/profile_step.py \
    --config base --device cuda --vocab 37000 --max-tokens 25000 --lengths 10 60 \
    > "$W/profile.txt" 2>&1
  snap
fi
compiled_rows "aiayn big"
log "done"
snap
cat "$OUT/train_gpu.md"
