#!/usr/bin/env bash
# Multi30k translation on this CPU, the whole recipe: prepare -> train -> average -> translate ->
# evaluate (sacreBLEU with signature, chrF, tokenized BLEU both ways) on test_2016_flickr.
#
#   bash scripts/multi30k.sh                       # English -> German, 60 minutes of training
#   SRC=de TGT=en bash scripts/multi30k.sh         # German -> English
#   DATA=/path/to/multi30k MINUTES=30 OUT=runs/x bash scripts/multi30k.sh
#   PRESET=translation-small-rnn ...               # other settings (docs/experiments/)
#   VOCAB=4000 ...                                 # BPE pieces, shared by both languages (default 8000)
#
# DATA holds train/val/test_2016_flickr .{en,de}(.gz) files (default data/multi30k, fetched there
# by `aiayn download multi30k` when missing). Settings come from the `translation-tiny-v2` preset
# (PRESET=translation-small-v2 runs the recipe at size small; a retired name such as
# translation-tiny fails naming its successor, a `--preset` and `--set` to give as PRESET and
# TRAIN_ARGS: docs/experiments/multi30k.md); TRAIN_ARGS and TRANSLATE_ARGS are passed on to
# `aiayn train` and `aiayn translate`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
SRC=${SRC:-en}; TGT=${TGT:-de}; MINUTES=${MINUTES:-60}; VOCAB=${VOCAB:-8000}
if [ -z "${DATA:-}" ]; then  # data/multi30k, fetched there on first use (or a shared copy beside the repo)
  DATA=data/multi30k
  [ -e "$DATA" ] || [ ! -d ../shared/data/multi30k ] || DATA=../shared/data/multi30k
  [ -e "$DATA" ] || .venv/bin/aiayn download multi30k --out "$DATA"
fi
OUT=${OUT:-runs/multi30k-$SRC-$TGT}
PRESET=${PRESET:-translation-tiny-v2}
A=.venv/bin/aiayn
RESUME=""
[ -e "$OUT/run/last" ] && RESUME=--resume  # a killed run continues where it stopped
set -x
$A prepare --src-lang "$SRC" --tgt-lang "$TGT" --train "$DATA/train" --valid "$DATA/val" \
    --test "$DATA/test_2016_flickr" --vocab-size "$VOCAB" --out "$OUT/data"
$A train --data "$OUT/data" --out "$OUT/run" --preset "$PRESET" --time-budget "$MINUTES" \
    --save-minutes 2 --eval-every 500 --eval-bleu-sentences 300 $RESUME ${TRAIN_ARGS:-}
$A average --run "$OUT/run" --last 5 --out "$OUT/model" --overwrite
for split in valid test; do
  $A translate --model "$OUT/model" --input "$OUT/data/$split.src.txt" --output "$OUT/$split.hyp" --overwrite ${TRANSLATE_ARGS:-}
  $A evaluate --hyp "$OUT/$split.hyp" --ref "$OUT/data/$split.tgt.txt" --lang "$TGT" --json > "$OUT/$split.scores.json"
  $A evaluate --hyp "$OUT/$split.hyp" --ref "$OUT/data/$split.tgt.txt" --lang "$TGT" --lowercase --json > "$OUT/$split.scores-lc.json"
done
set +x
$A evaluate --hyp "$OUT/test.hyp" --ref "$OUT/data/test.tgt.txt" --lang "$TGT"
$A evaluate --hyp "$OUT/test.hyp" --ref "$OUT/data/test.tgt.txt" --lang "$TGT" --lowercase
