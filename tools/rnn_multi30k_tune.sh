#!/usr/bin/env bash
# Short runs of the RNN baseline on Multi30k, scored on val only
# (docs/experiments/rnn-vs-transformer.md): each line of GRID is a set of `--set` overrides of the
# translation-small-rnn preset, trained for MINUTES (the rate's cooldown makes each a whole
# schedule), then its final dev NLL and greedy BLEU on the first 300 val sentences are printed.
# The test set is never read.
#
#   bash tools/rnn_multi30k_tune.sh runs/multi30k-en-de/data runs/rnn-tune
#   GRID=$'rnn_hidden=512\nlr_scale=2' MINUTES=8 bash tools/rnn_multi30k_tune.sh DATA OUT
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: $0 DATA OUT" >&2; exit 2; }
DATA=$1; OUT=$2; MINUTES=${MINUTES:-9}
PY=${PY:-.venv/bin/python}
GRID=${GRID:-$'-\nlr_scale=1\nrnn_hidden=512\nmax_tokens=2048'}
while IFS= read -r sets; do
  name=$(echo "$sets" | tr ' =' '_-')
  [ "$sets" = "-" ] && name=preset
  args=()
  [ "$sets" != "-" ] && args=(--set $sets)
  $PY -m aiayn train --data "$DATA" --out "$OUT/$name" --preset translation-small-rnn --time-budget "$MINUTES" \
      --eval-every 500 --eval-bleu-sentences 300 --save-minutes 100 --no-progress --overwrite \
      "${args[@]}" > "$OUT/$name.log" 2>&1
  $PY - "$OUT/$name/summary.json" "$sets" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1]))
d = s["final_dev"]
print(f"{sys.argv[2]:32s} steps {s['steps']:5d}  tok/s {s['tgt_tokens_per_s']:7.0f}  "
      f"dev nll {d['dev_nll']:.3f}  val BLEU (greedy, 300) {d.get('dev_bleu', float('nan')):.2f}")
PYEOF
done <<< "$GRID"
