#!/usr/bin/env bash
# English constituency parsing (§6.3) on a Penn Treebank, the whole recipe: treebank (clean, split
# by file, linearize) -> prepare -> train -> average -> parse (beam 21, alpha 0.3) -> EVALB F1.
#
#   bash scripts/parsing.sh                       # the NLTK 10% WSJ sample, 30 minutes of training
#   TREEBANK=/path/to/wsj MINUTES=600 PRESET=parsing \
#     TREEBANK_ARGS="--splits train=200-2199,valid=2200-2299,test=2300-2399" bash scripts/parsing.sh
#
# TREEBANK is a directory or zip of PTB .mrg files. Settings: the `parsing-cpu` preset and a
# 4,000-piece BPE source vocabulary, chosen on the dev files (docs/parsing.md). TREEBANK_ARGS,
# PREPARE_ARGS, TRAIN_ARGS and PARSE_ARGS go to `aiayn treebank`, `prepare`, `train` and `parse`;
# EVAL_SPLITS (default "valid test") says which splits to parse and score. A killed run resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${SETUP:-1}" = 1 ] && bash scripts/setup.sh
TREEBANK=${TREEBANK:-../shared/data/ptb-sample/treebank.zip}
OUT=${OUT:-runs/parsing}
MINUTES=${MINUTES:-30}
PRESET=${PRESET:-parsing-cpu}
SLOTS=${SLOTS:-xx}  # what stands for a word in the target: xx (§6.3), tags, or words
SRC_TYPE=${SRC_TYPE:-bpe}; SRC_VOCAB=${SRC_VOCAB:-4000}
EVAL_SPLITS=${EVAL_SPLITS:-valid test}
A=${AIAYN:-.venv/bin/aiayn}
RESUME=""
[ -e "$OUT/run/last" ] && RESUME=--resume
set -x
$A treebank --treebank "$TREEBANK" --out "$OUT/corpus" --slots "$SLOTS" --overwrite ${TREEBANK_ARGS:-}
# The target vocabulary: one id per tree symbol (and, with SLOTS=words, per word among the
# TGT_WORDS most frequent; rarer ones are UNK there, their slot still a slot), apart from the
# source's pieces: a shared BPE vocabulary would cut `(NP` into `(` + `NP`.
SYMBOLS=$(.venv/bin/python -c "import json,sys; print(json.load(open(sys.argv[1]))['train_target_symbols'])" "$OUT/corpus/corpus.json")
TGT_VOCAB=$((SYMBOLS + 4)); [ "$TGT_VOCAB" -gt "${TGT_WORDS:-4000}" ] && TGT_VOCAB=${TGT_WORDS:-4000}
$A prepare --src-lang words --tgt-lang tree --train "$OUT/corpus/train" --valid "$OUT/corpus/valid" \
    --test "$OUT/corpus/test" --separate-vocab --model-type "$SRC_TYPE" --vocab-size "$SRC_VOCAB" \
    --tgt-model-type word --tgt-vocab-size "$TGT_VOCAB" --max-len 0 --max-ratio 0 \
    --out "$OUT/data" ${PREPARE_ARGS:-}
# a checkpoint every 1/30 of the budget: the 5 averaged (n_average) span the last sixth of the run
$A train --data "$OUT/data" --out "$OUT/run" --preset "$PRESET" --time-budget "$MINUTES" \
    --save-minutes "$(awk "BEGIN {print $MINUTES / 30}")" --eval-every 250 --eval-bleu-sentences 0 \
    $RESUME ${TRAIN_ARGS:-}
$A average --run "$OUT/run" --out "$OUT/model" --overwrite
for split in $EVAL_SPLITS; do
  $A parse --model "$OUT/model" --input "$OUT/corpus/$split.words" --output "$OUT/$split.trees" \
      --linearized "$OUT/$split.lin" --overwrite --progress ${PARSE_ARGS:-} 2>&1 | tee "$OUT/$split.parse.log"
  $A evalb --gold "$OUT/corpus/$split.gold" --test "$OUT/$split.trees" --tags-from-gold > "$OUT/$split.evalb"
  $A evalb --gold "$OUT/corpus/$split.gold" --test "$OUT/$split.trees" --tags-from-gold --json > "$OUT/$split.evalb.json"
done
set +x
for split in $EVAL_SPLITS; do
  echo "== $split: $(tr '\r' '\n' < "$OUT/$split.parse.log" | grep -m1 '^aiayn parse:')"
  grep -A 12 -- "-- All --" "$OUT/$split.evalb" | grep -E "Valid|Recall|Precision|FMeasure|Complete"
  grep -A 12 -- "-- len<=40 --" "$OUT/$split.evalb" | grep -E "FMeasure" | sed 's/^/<=40 words: /'
done
