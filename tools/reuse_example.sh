#!/usr/bin/env bash
# The worked examples of docs/guides/reuse.md, on a Multi30k EN->DE model (what scripts/multi30k.sh
# writes to OUT/model):
#
#   MODEL=runs/m30k/t60/model DATA=../shared/data/multi30k OUT=runs/reuse bash tools/reuse_example.sh
#
# 1. fine-tune: the guide's five commands (prepare --vocab-from, train --init-from with its
#    fine-tuning defaults, average, translate, evaluate; evaluate here with --json, to read its
#    figures): EN->FR data encoded with the EN->DE model's vocabulary, MINUTES of fine-tuning
#    against MINUTES from scratch (the model's own config and vocabulary, and the schedule the
#    fine-tuning run chose, read from its run.json: only the first weights differ), each averaged
#    over its last n_average checkpoints and scored on test_2016_flickr;
# 2. score: every test reference against its own source, and against another sentence's source
#    (the references shifted by one line): how often the model prefers the true pair;
# 3. export: greedy decoding of the test set by aiayn, the ONNX export on onnxruntime and the
#    CTranslate2 export, each a fresh process (benchmarks/translate_e2e.py --greedy --onnx);
# 4. in-domain: the EN->DE model fine-tuned with the guide's commands on pairs it never saw (the
#    first 814 of val; dev: the last 200), test_2016_flickr scored before and after.
# The figures it prints at the end go to OUT/summary.txt, under the commit, the tree's state and
# the machine (benchmarks/provenance.py).
# Runs one job at a time (each uses both cores); a step whose output exists is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${MODEL:?MODEL=an EN->DE model directory}" "${DATA:?DATA=a Multi30k directory}" "${OUT:?OUT=a work directory}"
MINUTES=${MINUTES:-5}
A=.venv/bin/aiayn
mkdir -p "$OUT"
set -x
$A prepare --src-lang en --tgt-lang fr --train "$DATA/train" --valid "$DATA/val" \
    --test "$DATA/test_2016_flickr" --vocab-from "$MODEL" --out "$OUT/fr-data"
for how in init scratch; do
  run=$OUT/fr-$how
  if [ ! -e "$run/model" ]; then
    if [ "$how" = init ]; then
      $A train --data "$OUT/fr-data" --out "$run/run" --init-from "$MODEL" --time-budget "$MINUTES"
    else  # the fine-tuning run's schedule, as --set NAME=VALUE
      schedule=$(.venv/bin/python -c 'import json, sys
print(" ".join(f"{k}={v}" for k, v in json.load(open(sys.argv[1]))["finetune"].items()))' "$OUT/fr-init/run/run.json")
      # shellcheck disable=SC2086
      $A train --data "$OUT/fr-data" --out "$run/run" --config "$MODEL/config.json" --set $schedule \
          --time-budget "$MINUTES"
    fi
    $A average --run "$run/run" --out "$run/model"
  fi
  [ -e "$run/test.hyp" ] || $A translate --model "$run/model" --input "$OUT/fr-data/test.src.txt" --output "$run/test.hyp"
  $A evaluate --hyp "$run/test.hyp" --ref "$OUT/fr-data/test.tgt.txt" --lang fr --json > "$run/test.scores.json"
done
src=$OUT/fr-data/test.src.txt  # the English side of test_2016_flickr
gunzip -c "$DATA/test_2016_flickr.de.gz" > "$OUT/test.de"
{ tail -n +2 "$OUT/test.de"; head -n 1 "$OUT/test.de"; } > "$OUT/test.shifted.de"
$A score --model "$MODEL" --src "$src" --ref "$OUT/test.de" --format tsv --output "$OUT/true.tsv" --overwrite
$A score --model "$MODEL" --src "$src" --ref "$OUT/test.shifted.de" --format tsv --output "$OUT/shifted.tsv" --overwrite
[ -e "$OUT/greedy/results.json" ] || .venv/bin/python benchmarks/translate_e2e.py --model "$MODEL" \
    --src "$src" --ref "$OUT/test.de" --out "$OUT/greedy" --greedy --onnx --precisions fp32 \
    --ct2 int8 float32 --reps 2
ind=$OUT/indomain
if [ ! -e "$ind/model" ]; then
  mkdir -p "$ind/raw"
  for l in en de; do
    # sed reads to the end: head would close the pipe early, and pipefail stop the script
    gunzip -c "$DATA/val.$l.gz" | sed -n '1,814p' > "$ind/raw/train.$l"
    gunzip -c "$DATA/val.$l.gz" | sed -n '815,$p' > "$ind/raw/dev.$l"
  done
  $A prepare --src-lang en --tgt-lang de --train "$ind/raw/train" --valid "$ind/raw/dev" \
      --test "$DATA/test_2016_flickr" --vocab-from "$MODEL" --out "$ind/data"
  $A train --data "$ind/data" --out "$ind/run" --init-from "$MODEL" --time-budget "$MINUTES"
  $A average --run "$ind/run" --out "$ind/model"
fi
for m in before after; do
  dir=$MODEL; [ "$m" = after ] && dir=$ind/model
  [ -e "$ind/test.$m.hyp" ] || $A translate --model "$dir" --input "$ind/data/test.src.txt" --output "$ind/test.$m.hyp"
  $A evaluate --hyp "$ind/test.$m.hyp" --ref "$ind/data/test.tgt.txt" --lang de --json > "$ind/test.$m.scores.json"
done
set +x
{
.venv/bin/python -c 'import sys; sys.path.insert(0, "benchmarks"); from provenance import stamp, stamp_line; print(stamp_line(stamp()))'
for how in init scratch; do
  .venv/bin/python - "$how" "$OUT/fr-$how" <<'PY'
import json, sys
how, run = sys.argv[1], sys.argv[2]
s = json.load(open(f"{run}/test.scores.json"))
rows = [json.loads(x) for x in open(f"{run}/run/metrics.jsonl")]
train = [r for r in rows if r.get("kind") == "train"]
dev = [r for r in rows if r.get("kind") == "dev"]
print(f"fine-tune {how}: {train[-1]['step']} updates, test sacreBLEU {s['sacrebleu']['score']:.2f}, "
      f"chrF {s['chrf']['score']:.2f}" + (f", last dev ppl {dev[-1].get('dev_ppl', float('nan')):.2f}" if dev else ""))
PY
done
paste "$OUT/true.tsv" "$OUT/shifted.tsv" | awk -F'\t' '{n++; t+=$1; tk+=$2; s+=$4; sk+=$5; if ($3 > $6) w++}
  END {printf "score: true pairs %.3f nats/token, shifted %.3f; the true reference scores higher per token in %d of %d (%.1f%%)\n", t/tk, s/sk, w, n, 100*w/n}'
.venv/bin/python - "$ind" <<'PY'
import json, sys
ind = sys.argv[1]
s = {m: json.load(open(f"{ind}/test.{m}.scores.json")) for m in ("before", "after")}
train = [json.loads(x) for x in open(f"{ind}/run/metrics.jsonl")]
steps = [r["step"] for r in train if r.get("kind") == "train"][-1]
print(f"in-domain EN->DE, 814 unseen pairs, {steps} updates: test sacreBLEU "
      f"{s['before']['sacrebleu']['score']:.2f} -> {s['after']['sacrebleu']['score']:.2f}, chrF "
      f"{s['before']['chrf']['score']:.2f} -> {s['after']['chrf']['score']:.2f}")
PY
} | tee "$OUT/summary.txt"
