#!/usr/bin/env bash
# English constituency parsing (§6.3) on a Penn Treebank, the whole recipe: treebank (clean, split
# by file, linearize) -> train -> average -> parse -> EVALB F1 (docs/guides/parsing.md).
#
#   bash scripts/parsing.sh                            # the NLTK 10% WSJ sample, 30 minutes
#   MINUTES=10 EVAL_SPLITS=valid bash scripts/parsing.sh   # a shorter run, scored on dev only
#   PARSER=seq2seq bash scripts/parsing.sh             # §6.3's sequence-to-sequence parser
#   PARSER=chart VOTERS=runs/parsing-s2s bash scripts/parsing.sh   # a chart that takes votes
#
# Settings (environment variables):
#   TREEBANK     a directory or zip of PTB .mrg files (default: the workspace's WSJ sample)
#   OUT          where everything goes (default runs/parsing); a killed run resumes
#   MINUTES      training time in all (default 30)
#   PARSER       chart (default; not in the paper: the paper's encoder, a score per span and
#                label, CKY) or seq2seq (§6.3: the Transformer writes the linearized tree, beam 21)
#   ENSEMBLE     N > 1: N models of MINUTES/N minutes each (seeds 1..N), parsing as one ensemble
#   PARALLEL     1: train the ENSEMBLE's members at once, MINUTES each (one GPU; logs OUT/runK.log)
#   VOTERS       with PARSER=chart: an earlier OUT of this script whose models (DIR/model,
#                DIR/model2, ...) parse each split first; their brackets vote in the chart's CKY
#   EVAL_SPLITS  the splits to parse and score (default "valid test"; empty: train only)
#   TRAIN_ARGS   more options for every `aiayn train`, e.g. "--set d_model=256 d_ff=1024"
#
# The settings chosen on dev (docs/experiments/parsing.md), none of them in the paper: the words
# written in the target (the 4,000 commonest; §6.3 writes XX), source words seen under 3 times in
# training written as their signatures, the training set tripled by subtree substitution, and,
# for the sequence-to-sequence parser, one word vocabulary for both sides and tree-constrained beam
# search. The paper's own choices are plain commands in docs/guides/parsing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${SETUP:-1}" = 1 ] && bash scripts/setup.sh
TREEBANK=${TREEBANK:-../shared/data/ptb-sample/treebank.zip}
OUT=${OUT:-runs/parsing}
MINUTES=${MINUTES:-30}
PARSER=${PARSER:-chart}
ENSEMBLE=${ENSEMBLE:-1}
PARALLEL=${PARALLEL:-0}
VOTERS=${VOTERS:-}
EVAL_SPLITS=${EVAL_SPLITS-valid test}
A=.venv/bin/aiayn
fail() { echo "scripts/parsing.sh: $*" >&2; exit 2; }
# dev figures: the chart's loss and bracket F1 (it parses dev, seconds); the sequence model's loss
case "$PARSER" in
  chart) PRESET=parsing-chart-small; EVAL=(--eval-every 1000) ;;
  seq2seq) PRESET=parsing-seq2seq-small; EVAL=(--eval-every 250 --eval-bleu-sentences 0) ;;
  *) fail "PARSER must be chart or seq2seq (got '$PARSER')" ;;
esac
[ "$ENSEMBLE" -ge 1 ] 2>/dev/null || fail "ENSEMBLE must be a number of models, 1 or more (got '$ENSEMBLE')"
if [ -n "$VOTERS" ]; then
  [ "$PARSER" = chart ] || fail "VOTERS needs PARSER=chart (votes weigh brackets in a chart)"
  [ -d "$VOTERS/model" ] || fail "VOTERS=$VOTERS: no model there ($VOTERS/model)"
fi
EACH=$MINUTES
[ "$PARALLEL" = 1 ] || EACH=$(awk "BEGIN {print $MINUTES / $ENSEMBLE}")
set -x
$A treebank --treebank "$TREEBANK" --out "$OUT/corpus" --slots words --target-words 4000 \
    --signatures 3 --augment 2 --overwrite
DATA="$OUT/corpus"  # the chart parser reads the corpus; the sequence-to-sequence parser a dataset
if [ "$PARSER" = seq2seq ]; then
  # one vocabulary of whole tokens for both sides (§3.4: shared, tied embeddings): every training
  # word left after signatures, and the tree symbols
  WORDS=$(.venv/bin/python -c "import json,sys; print(json.load(open(sys.argv[1]))['vocabulary'])" "$OUT/corpus/corpus.json")
  $A prepare --src-lang src --tgt-lang tree --train "$OUT/corpus/train" --valid "$OUT/corpus/valid" \
      --test "$OUT/corpus/test" --model-type word --vocab-size "$((WORDS < 8000 ? WORDS : 8000))" \
      --max-len 0 --max-ratio 0 --out "$OUT/data"
  DATA="$OUT/data"
fi
set +x
MODELS=(); PIDS=(); LOGS=()
for k in $(seq 1 "$ENSEMBLE"); do
  SUFFIX=""; [ "$k" -gt 1 ] && SUFFIX=$k  # run, run2, ...
  RESUME=""; [ -e "$OUT/run$SUFFIX/last" ] && RESUME=--resume
  # a checkpoint every 1/30 of the budget: the 5 averaged (n_average) span the run's last sixth
  TRAIN=($A train --data "$DATA" --out "$OUT/run$SUFFIX" --preset "$PRESET" --time-budget "$EACH"
         --save-minutes "$(awk "BEGIN {print $EACH / 30}")" "${EVAL[@]}" --seed "$k" $RESUME
         ${TRAIN_ARGS:-})
  echo "+ ${TRAIN[*]}" >&2
  if [ "$PARALLEL" = 1 ]; then
    "${TRAIN[@]}" > "$OUT/run$SUFFIX.log" 2>&1 & PIDS+=($!); LOGS+=("$OUT/run$SUFFIX.log")
  else
    "${TRAIN[@]}"
  fi
  MODELS+=("$OUT/model$SUFFIX")
done
for k in "${!PIDS[@]}"; do  # the first failure stops the others and shows its log
  wait "${PIDS[$k]}" || { kill "${PIDS[@]}" 2>/dev/null; tail -n 20 "${LOGS[$k]}" >&2; fail "training failed (log: ${LOGS[$k]})"; }
done
set -x
for k in $(seq 1 "$ENSEMBLE"); do
  SUFFIX=""; [ "$k" -gt 1 ] && SUFFIX=$k
  $A average --run "$OUT/run$SUFFIX" --out "$OUT/model$SUFFIX" --overwrite
done
CONSTRAINED=""; [ "$PARSER" = seq2seq ] && CONSTRAINED=--constrained
for split in $EVAL_SPLITS; do
  VOTES=()
  if [ -n "$VOTERS" ]; then
    mkdir -p "$OUT/votes"
    for m in "$VOTERS"/model "$VOTERS"/model[0-9]*; do
      [ -d "$m" ] || continue
      V="$OUT/votes/$split.$(basename "$m").trees"
      C=--constrained; grep -q '"chart-parser"' "$m/config.json" 2>/dev/null && C=""
      [ -e "$V" ] || $A parse --model "$m" --input "$OUT/corpus/$split.words" --output "$V" $C
      VOTES+=("$V")
    done
    VOTES=(--votes "${VOTES[@]}")
  fi
  $A parse --model "${MODELS[@]}" --input "$OUT/corpus/$split.words" --output "$OUT/$split.trees" \
      --overwrite $CONSTRAINED "${VOTES[@]}" 2>&1 | tee "$OUT/$split.parse.log"
  $A evalb --gold "$OUT/corpus/$split.gold" --test "$OUT/$split.trees" --tags-from-gold > "$OUT/$split.evalb"
  $A evalb --gold "$OUT/corpus/$split.gold" --test "$OUT/$split.trees" --tags-from-gold --json > "$OUT/$split.evalb.json"
done
set +x
for split in $EVAL_SPLITS; do
  echo "== $split: $(tr '\r' '\n' < "$OUT/$split.parse.log" | grep -m1 '^aiayn parse:')"
  grep -A 12 -- "-- All --" "$OUT/$split.evalb" | grep -E "Valid|Recall|Precision|FMeasure|Complete"
  grep -A 12 -- "-- len<=40 --" "$OUT/$split.evalb" | grep -E "FMeasure" | sed 's/^/<=40 words: /'
done
