#!/bin/bash
# Everything one short GPU loan measures, in one run that ends by itself within BUDGET seconds
# (default 480), most telling first, so that whatever the time allows comes back:
#   1. benchmarks/train_gpu.sh's eager rows (the matmul peak; aiayn and torch.nn.Transformer, base
#      and big, 25,000-token updates, 37,000 ids; base also with aiayn's eager loss, to show what
#      the compiled loss buys), each row capped at 90 s;
#   2. aiayn's compiled row of base (`aiayn train --compile`: each layer compiled), capped at
#      COMPILE_SECONDS (default 150);
#   3. benchmarks/gpu_e2e.sh: the WMT user's pipeline (torchrun train killed once and resumed,
#      average, translate, evaluate) on the Multi30k files carried in DATA, MINUTES of training;
#   4. benchmarks/profile_step.py on the GPU: where aiayn's base step spends the GPU's time, and
#      how busy the GPU is (host-bound or not), capped at PROFILE_SECONDS (default 45);
#   5. torch.nn.Transformer's compiled row of base, in whatever time is left.
# On one H100 (2026-11-26, before the compiled loss and the per-layer compile) the eager rows took
# 77 s, the profile 21 s, and neither whole-model compiled row finished compiling in 160 s.
# Results in $OUT: gpu.tgz (every log and JSON line, refreshed after each part, so a run cut short
# still returns what it finished), train_gpu.md (the table of every row), e2e.txt, profile.txt.
#
#     OUT=runs/gpu DATA=runs/gpu-carry/multi30k bash benchmarks/gpu_session.sh
set -uo pipefail
OUT=${OUT:-runs/gpu-session}
DATA=${DATA:-runs/gpu-carry/multi30k}
PEAK=${PEAK_TFLOPS:-989.4}
PY=${PYTHON:-python3}
END=$((SECONDS + ${BUDGET:-480}))
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
COMPILE=0 ROW_SECONDS=90 OUT=$W/train_eager bash benchmarks/train_gpu.sh > "$W/train_eager.log" 2>&1
snap
cap=$(( $(left) < ${COMPILE_SECONDS:-150} ? $(left) - 30 : ${COMPILE_SECONDS:-150} ))
if [ "$cap" -ge 60 ]; then
  log "aiayn's compiled row of base, $cap s"
  EAGER=0 COMPILE_CONFIGS=base ONLY=aiayn ROW_SECONDS=$cap OUT=$W/train_compiled \
    timeout "$((cap + 10))" bash benchmarks/train_gpu.sh > "$W/train_compiled.log" 2>&1
  snap
fi
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
cap=$(( $(left) - 15 ))
if [ "$cap" -ge 60 ]; then
  log "torch's compiled row of base, $cap s"
  EAGER=0 COMPILE_CONFIGS=base ONLY=torch ROW_SECONDS=$cap OUT=$W/train_torch_compiled \
    timeout "$((cap + 5))" bash benchmarks/train_gpu.sh > "$W/train_torch_compiled.log" 2>&1
fi
log "done"
snap
cat "$OUT/train_gpu.md"
