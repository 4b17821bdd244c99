#!/usr/bin/env bash
# Decoding settings of a finished Multi30k run, scored on val only (docs/experiments/multi30k.md):
# for each N, average the newest N checkpoints, translate val with each beam/alpha pair, print
# sacreBLEU. The test set is never read.
#
#   bash tools/multi30k_tune.sh runs/multi30k-en-de 5 10                 # beam 4, alpha 0.6 1.0 1.5 2.0
#   GRID="4 1.2,4 1.8,8 1.5" TGT=en bash tools/multi30k_tune.sh runs/multi30k-de-en 5
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: $0 OUT N [N ...]   (OUT as made by scripts/multi30k.sh)" >&2; exit 2; }
OUT=$1; shift
TGT=${TGT:-de}; A=.venv/bin/aiayn
IFS=, read -ra PAIRS <<< "${GRID:-4 0.6,4 1.0,4 1.5,4 2.0}"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
for n in "$@"; do
  $A average --run "$OUT/run" --last "$n" --out "$TMP/avg$n" > /dev/null
  for pair in "${PAIRS[@]}"; do
    read -r beam alpha <<< "$pair"
    $A translate --model "$TMP/avg$n" --input "$OUT/data/valid.src.txt" --output "$TMP/hyp" \
        --overwrite --beam "$beam" --alpha "$alpha" 2> /dev/null
    score=$($A evaluate --hyp "$TMP/hyp" --ref "$OUT/data/valid.tgt.txt" --lang "$TGT" --json |
            .venv/bin/python -c "import json, sys; print(f\"{json.load(sys.stdin)['sacrebleu']['score']:.2f}\")")
    echo "average $n, beam $beam, alpha $alpha: val sacreBLEU $score"
  done
done
