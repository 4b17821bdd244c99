#!/bin/bash
# The pipeline a WMT user runs, end to end on one GPU, at Multi30k's size (its files carried to the
# GPU machine, which reaches no network): prepare, `torchrun --nproc_per_node=1 -m aiayn train
# --preset base` in bf16 with a checkpoint every 30 seconds, SIGKILLed once it has written one and
# continued with --resume on the GPU, then average, `translate --device cuda` and evaluate. The
# base preset's one change: the paper's peak learning rate (7.0e-4, Eq. 3 at step 4,000) reached
# in 300 updates, which a run of minutes can pass (warmup_steps=300, lr_scale=0.274 =
# sqrt(300 / 4000)); with warmup_steps=300 alone the peak is 3.6x the paper's, and base did not
# learn on one H100 (dev perplexity 422 at step 200, rising after). Logs in $OUT. DEVICE=cpu
# and SET (more --set changes, e.g. a tiny model) run it anywhere: the test suite does, at a
# tiny size; KILL_AFTER is the seconds from the first checkpoint to the kill (default 10; 0: as
# soon as it appears); STEPS and SAVE_EVERY (updates) replace MINUTES and SAVE_MINUTES, for a run
# that does the same on a loaded machine as on an idle one (the test suite's).
#
#     DATA=runs/gpu-carry/multi30k OUT=runs/gpu-e2e MINUTES=1.5 bash benchmarks/gpu_e2e.sh
set -uo pipefail
DATA=${DATA:-runs/gpu-carry/multi30k}
OUT=${OUT:-runs/gpu-e2e}
MINUTES=${MINUTES:-1.5}
DEVICE=${DEVICE:-cuda}
PRECISION=${PRECISION:-bf16}
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 AIAYN_ALLOCATOR=system
A=("$PY" -m aiayn)
mkdir -p "$OUT"
W=${WORK:-$OUT/work}
rm -rf "$W"
"${A[@]}" prepare --src-lang en --tgt-lang de --train "$DATA/train" --valid "$DATA/val" \
    --test "$DATA/test_2016_flickr" --vocab-size "${VOCAB:-8000}" --out "$W/data" --no-progress || exit 1
if [ -n "${STEPS:-}" ]; then
  LIMITS=(--max-steps "$STEPS" --save-every "${SAVE_EVERY:-100}")
else
  LIMITS=(--time-budget "$MINUTES" --save-minutes "${SAVE_MINUTES:-0.5}")
fi
TRAIN=("$PY" -m torch.distributed.run --nproc_per_node=1 -m aiayn train --data "$W/data"
       --out "$W/run" --preset base --set warmup_steps=300 lr_scale=0.274 ${SET:-} --precision "$PRECISION"
       --device "$DEVICE" "${LIMITS[@]}"
       --eval-every 200 --eval-bleu-sentences 100 --no-tensorboard --no-progress)
# the first session, killed (SIGKILL) KILL_AFTER s after its first checkpoint: torchrun's agent
# and its worker, the trainer, which torchrun starts in a session of its own (the PID in the run's
# lock file): killing the agent's process group alone leaves the trainer running
setsid "${TRAIN[@]}" > "$OUT/train1.log" 2>&1 &
PID=$!
for _ in $(seq 1 3000); do
  [ -d "$W/run/checkpoints" ] && ls "$W/run/checkpoints" | grep -q '^step_' && break
  kill -0 "$PID" 2>/dev/null || break
  sleep 0.1
done
sleep "${KILL_AFTER:-10}"
TRAINER=$(cut -d' ' -f1 "$W/.run.lock" 2>/dev/null)
kill -9 -- -"$PID" 2>/dev/null
[ -n "$TRAINER" ] && { kill -9 -- -"$TRAINER" 2>/dev/null || kill -9 "$TRAINER" 2>/dev/null; }
wait "$PID" 2>/dev/null
while [ -n "$TRAINER" ] && kill -0 "$TRAINER" 2>/dev/null; do sleep 0.2; done
echo "killed the first session after: $(ls "$W/run/checkpoints" 2>/dev/null | tr '\n' ' ')" | tee "$OUT/e2e.txt"
"${TRAIN[@]}" --resume > "$OUT/train2.log" 2>&1 || { tail -5 "$OUT/train2.log"; exit 1; }
grep -E "resuming|^done|final dev|skipped" "$OUT/train2.log" | tee -a "$OUT/e2e.txt"
# the last 5 checkpoints, or as many as a short run wrote
N=$(ls "$W/run/checkpoints" | grep -c '^step_')
"${A[@]}" average --run "$W/run" --last $((N < 5 ? N : 5)) --out "$W/model" | tee -a "$OUT/e2e.txt"
start=$SECONDS
"${A[@]}" translate --model "$W/model" --input "$W/data/test.src.txt" --output "$W/test.hyp" \
    --device "$DEVICE" --precision "$PRECISION" || exit 1
echo "translate ($(wc -l < "$W/data/test.src.txt") sentences, beam 4, $PRECISION, $DEVICE, start to end): $((SECONDS - start)) s" | tee -a "$OUT/e2e.txt"
"${A[@]}" evaluate --hyp "$W/test.hyp" --ref "$W/data/test.tgt.txt" --lang de | tee -a "$OUT/e2e.txt"
"$PY" -c 'import sys; sys.path.insert(0, "benchmarks"); import provenance as p; print(p.stamp_line(p.stamp()))' \
  | tee -a "$OUT/e2e.txt"  # the commit (clean or not) and the host CPU
grep -h '"dev"' "$W/run/metrics.jsonl" | cut -c1-160 > "$OUT/dev.jsonl"
cp "$W/run/metrics.jsonl" "$OUT/metrics.jsonl"
cp "$W/run/summary.json" "$OUT/summary.json"
