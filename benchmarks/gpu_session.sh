#!/bin/bash
# Everything one short GPU loan measures, in one run that ends by itself within BUDGET seconds
# (default 540), most telling first, so that whatever the time allows comes back:
#   1. benchmarks/train_gpu.sh's eager rows (the matmul peak; aiayn and torch.nn.Transformer, base
#      and big, 25,000-token updates, 37,000 ids), each row capped at 70 s;
#   2. benchmarks/gpu_e2e.sh: the WMT user's pipeline (torchrun train killed once and resumed,
#      average, translate, evaluate) on the Multi30k files carried in DATA;
#   3. the compiled rows of base (aiayn's, then torch's), in the time left but PROFILE_SECONDS;
#   4. benchmarks/profile_step.py on the GPU: where aiayn's base step spends the GPU's time, and
#      how busy the GPU is (host-bound or not), capped at PROFILE_SECONDS (default 60).
# On one H100 (2026-11-26) the eager rows took 77 s, the profile 21 s, and neither compiled row
# finished compiling in 160 s: hence this order.
# Results in $OUT: gpu.tgz (every log and JSON line, refreshed after each part, so a run cut short
# still returns what it finished), train_gpu.md (the table of every row), e2e.txt, profile.txt.
#
#     OUT=runs/gpu DATA=runs/gpu-carry/multi30k bash benchmarks/gpu_session.sh
set -uo pipefail
OUT=${OUT:-runs/gpu-session}
DATA=${DATA:-runs/gpu-carry/multi30k}
PEAK=${PEAK_TFLOPS:-989.4}
PY=${PYTHON:-python3}
END=$((SECONDS + ${BUDGET:-540}))
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 AIAYN_ALLOCATOR=system
W=$(mktemp -d)
mkdir -p "$OUT"
left() { echo $((END - SECONDS)); }
snap() {
  cat "$W"/train_*/train_gpu.jsonl 2>/dev/null > "$W/rows.jsonl"
  $PY benchmarks/gpu_table.py "$W/rows.jsonl" "$PEAK" > "$OUT/train_gpu.md" 2>/dev/null
  cp "$W/profile.txt" "$OUT/" 2>/dev/null; cp "$W/e2e/e2e.txt" "$OUT/" 2>/dev/null
  tar czf "$OUT/gpu.tgz.part" -C "$W" --exclude=work . && mv "$OUT/gpu.tgz.part" "$OUT/gpu.tgz"
}
log() { echo "== $* ($(left) s left)" | tee -a "$W/session.log" >&2; }

log "eager rows"
COMPILE=0 ROW_SECONDS=70 OUT=$W/train_eager bash benchmarks/train_gpu.sh > "$W/train_eager.log" 2>&1
snap
log "the WMT pipeline end to end"
DATA=$DATA OUT=$W/e2e WORK=$W/e2e/work MINUTES=${MINUTES:-1.5} timeout $(($(left) - 60)) \
  bash benchmarks/gpu_e2e.sh > "$W/e2e.log" 2>&1
rm -rf "$W/e2e/work/run/checkpoints" "$W/e2e/work/model"
snap
PROFILE=${PROFILE_SECONDS:-60}
cap=$(( $(left) - PROFILE - 30 ))
if [ "$cap" -ge 60 ]; then
  log "compiled rows of base, $cap s in all"
  EAGER=0 COMPILE_CONFIGS=base ROW_SECONDS=$cap OUT=$W/train_compiled \
    timeout "$cap" bash benchmarks/train_gpu.sh > "$W/train_compiled.log" 2>&1
  snap
fi
if [ "$(left)" -ge 30 ]; then
  log "profile of aiayn's base step"
  timeout $(( $(left) < PROFILE ? $(left) - 10 : PROFILE )) $PY benchmarks/profile_step.py \
    --config base --device cuda --vocab 37000 --max-tokens 25000 --lengths 10 60 \
    > "$W/profile.txt" 2>&1
fi
log "done"
snap
cat "$OUT/train_gpu.md"
