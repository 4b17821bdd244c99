#!/usr/bin/env bash
# English constituency parsing (§6.3) on a Penn Treebank, the whole recipe: treebank (clean, split
# by file, linearize) -> prepare -> train -> average -> parse (beam 21, alpha 0.3) -> EVALB F1.
#
#   bash scripts/parsing.sh                       # the NLTK 10% WSJ sample, 30 minutes of training
#   MINUTES=10 EVAL_SPLITS=valid bash scripts/parsing.sh                 # a shorter dev run
#   SLOTS=xx VOCAB=separate SIGNATURES=0 AUGMENT=0 PRESET=parsing-cpu CONSTRAINED=0 \
#     bash scripts/parsing.sh                                           # the paper's choices (§6.3)
#   TREEBANK=/path/to/wsj MINUTES=600 PRESET=parsing \
#     TREEBANK_ARGS="--splits train=200-2199,valid=2200-2299,test=2300-2399" bash scripts/parsing.sh
#
# TREEBANK is a directory or zip of PTB .mrg files. The default is the setting chosen on dev
# (docs/parsing.md, run e25): the `parsing-small-v3` preset (pre-norm, dropout 0.15, source word
# dropout 0.1), the words written in the target (SLOTS=words, the 4,000 commonest; §6.3 writes
# XX) with one word vocabulary for both sides (VOCAB=shared-words), source words seen under 3
# times in training written as their signatures (SIGNATURES=3; 0 keeps every word), the
# training set grown AUGMENT=2 times over by subtree substitution (each new tree a training tree
# with one phrase swapped for another of the same label; 0: off), and tree-constrained beam
# search (CONSTRAINED=1, `aiayn parse --constrained`); none of these is in the paper.
# SLOTS=xx|tags, VOCAB=separate (a BPE source, one target id per tree symbol), SIGNATURES=0,
# AUGMENT=0, CONSTRAINED=0 and PRESET=parsing-cpu give back the paper's choices.
# TREEBANK_ARGS, PREPARE_ARGS, TRAIN_ARGS and PARSE_ARGS go to `aiayn treebank`, `prepare`,
# `train` and `parse`; EVAL_SPLITS (default "valid test") says which splits to parse and score.
# ENSEMBLE=N trains N models one after the other, MINUTES/N minutes each with seeds 1..N (runs
# $OUT/run, $OUT/run2, ...), and parses with their ensemble (`aiayn parse --model A B`); PRESET
# may name several presets, which the members take in turn (ENSEMBLE defaults to their number);
# a member's preset may carry config changes, `parsing-small-v3:p_drop=0.2,eps_ls=0.05` meaning
# `--preset parsing-small-v3 --set p_drop=0.2 eps_ls=0.05`. PARALLEL=1 trains the members at once, each for
# MINUTES (on one GPU, which small models leave mostly idle; logs in $OUT/runK.log, for chart
# parsers $OUT/modelK.log). A killed run resumes. PYTHON and AIAYN name the interpreter and the
# command (default: .venv's).
# PARSER=chart (not in the paper) trains the span-based chart parser instead (`aiayn train-chart`,
# aiayn/parsing/chart.py: the paper's encoder, a score per span and label, CKY): no prepare, no
# beam search. CHART lists its members' config changes, space-separated, each a comma-separated
# NAME=VALUE list or `-` for the defaults (ENSEMBLE defaults to their number), e.g.
# CHART="- d_model=256,d_ff=1024,n_heads=8,d_span=256"; finished members are kept on a rerun.
# VOTERS=DIR (with PARSER=chart): the models DIR/model, DIR/model2, ... (an earlier run of this
# script, e.g. sequence-to-sequence parsers) parse each split first (trees in $OUT/votes/, kept
# on a rerun), and each of their trees votes for its brackets in the chart's CKY (`aiayn parse
# --votes`; VOTE_WEIGHT, default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${SETUP:-1}" = 1 ] && bash scripts/setup.sh
TREEBANK=${TREEBANK:-../shared/data/ptb-sample/treebank.zip}
OUT=${OUT:-runs/parsing}
MINUTES=${MINUTES:-30}
PRESET=${PRESET:-parsing-small-v3}  # several (space-separated): the ENSEMBLE's members take them in turn
read -ra PRESETS <<< "$PRESET"
SLOTS=${SLOTS:-words}  # what stands for a word in the target: xx (§6.3), tags, or words
VOCAB=${VOCAB:-shared-words}  # shared-words or separate (source BPE, target symbols)
CONSTRAINED=${CONSTRAINED:-1}  # 1: the search writes only trees over the sentence's words
SIGNATURES=${SIGNATURES:-3}  # N > 0: source words seen < N times in training become signatures
AUGMENT=${AUGMENT:-2}  # K > 0: K rounds of new training trees by subtree substitution
SRC_TYPE=${SRC_TYPE:-bpe}; SRC_VOCAB=${SRC_VOCAB:-4000}
EVAL_SPLITS=${EVAL_SPLITS-valid test}  # empty: train only
PARSER=${PARSER:-seq2seq}  # seq2seq (§6.3) or chart (not in the paper)
read -ra CHARTS <<< "${CHART:--}"
MEMBERS=${#PRESETS[@]}; [ "$PARSER" = chart ] && MEMBERS=${#CHARTS[@]}
ENSEMBLE=${ENSEMBLE:-$MEMBERS}  # N > 1: N models of MINUTES/N minutes each, parsing as their ensemble
PARALLEL=${PARALLEL:-0}  # 1: train the ENSEMBLE's members at once, MINUTES each
A=${AIAYN:-.venv/bin/aiayn}
PY=${PYTHON:-.venv/bin/python}
if [ "$SIGNATURES" -gt 0 ] && [ "$VOCAB" != shared-words ]; then
  # `aiayn parse` maps a word to its signature only where a word vocabulary cannot read it
  echo "scripts/parsing.sh: SIGNATURES=$SIGNATURES needs VOCAB=shared-words (with VOCAB=$VOCAB set SIGNATURES=0)" >&2; exit 2
fi
if [ "$PARSER" != seq2seq ] && [ "$PARSER" != chart ]; then
  echo "scripts/parsing.sh: PARSER must be seq2seq or chart (got '$PARSER')" >&2; exit 2
fi
VOTERS=${VOTERS:-}
if [ -n "$VOTERS" ]; then
  [ "$PARSER" = chart ] || { echo "scripts/parsing.sh: VOTERS needs PARSER=chart (votes weigh brackets in a chart)" >&2; exit 2; }
  [ -d "$VOTERS/model" ] || { echo "scripts/parsing.sh: VOTERS=$VOTERS: no model there ($VOTERS/model)" >&2; exit 2; }
fi
if ! [ "$ENSEMBLE" -ge 1 ] 2>/dev/null; then
  echo "scripts/parsing.sh: ENSEMBLE must be a number of models, 1 or more (got '$ENSEMBLE')" >&2; exit 2
fi
PARSE_CONSTRAINT=""
[ "$CONSTRAINED" = 1 ] && PARSE_CONSTRAINT=--constrained
set -x
# with SLOTS=words, the TGT_WORDS commonest training words are written in the target, others XX
$A treebank --treebank "$TREEBANK" --out "$OUT/corpus" --slots "$SLOTS" --target-words "${TGT_WORDS:-4000}" \
    --signatures "$SIGNATURES" --augment "$AUGMENT" --overwrite ${TREEBANK_ARGS:-}
suffix() { [ "$1" -gt 1 ] && echo "$1" || true; }  # member k's run/model suffix: run, run2, ...
set_args() {  # "F=V,G=W" -> SET_ARGS=(--set F=V G=W); "" or "-" -> SET_ARGS=()
  SET_ARGS=()
  if [ -n "$1" ] && [ "$1" != - ]; then IFS=, read -ra SET_ARGS <<< "$1"; SET_ARGS=(--set "${SET_ARGS[@]}"); fi
}
MODELS=()
PIDS=()  # members training in the background (PARALLEL=1) and their logs
LOGS=()
member() {  # LOG COMMAND...: run a member's training, in the background with PARALLEL=1
  local log=$1; shift
  if [ "$PARALLEL" = 1 ]; then "$@" --no-progress > "$log" 2>&1 & PIDS+=($!); LOGS+=("$log"); else "$@"; fi
}
wait_members() {  # the first failure stops the others and shows its log
  for k in "${!PIDS[@]}"; do
    wait "${PIDS[$k]}" || { kill "${PIDS[@]}" 2>/dev/null; tail -n 20 "${LOGS[$k]}" >&2; echo "scripts/parsing.sh: training failed (log: ${LOGS[$k]})" >&2; exit 1; }
    grep -E "^(done|final dev)" "${LOGS[$k]}" | sed "s|^|$(basename "${LOGS[$k]}" .log): |"
  done
}
EACH=$MINUTES
[ "$PARALLEL" = 1 ] || EACH=$(awk "BEGIN {print $MINUTES / $ENSEMBLE}")
if [ "$PARSER" = chart ]; then
  PARSE_CONSTRAINT=""  # CKY: every output is a tree over the words
  for k in $(seq 1 "$ENSEMBLE"); do
    SUFFIX=$(suffix "$k")
    set_args "${CHARTS[$(( (k - 1) % ${#CHARTS[@]} ))]}"
    [ -e "$OUT/model$SUFFIX/chart.json" ] || member "$OUT/model$SUFFIX.log" $A train-chart --corpus "$OUT/corpus" \
        --out "$OUT/model$SUFFIX" --minutes "$EACH" --seed "$k" --overwrite "${SET_ARGS[@]}" ${TRAIN_ARGS:-}
    MODELS+=("$OUT/model$SUFFIX")
  done
  wait_members
else
  SRC_LANG=words
  [ "$SIGNATURES" -gt 0 ] && SRC_LANG=src  # the source with rare words as their signatures
  corpus_info() { $PY -c "import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], 0))" "$OUT/corpus/corpus.json" "$1"; }
  if [ "$VOCAB" = shared-words ]; then
    # one vocabulary of whole tokens for both sides (§3.4: shared, tied embeddings): the
    # WORD_VOCAB commonest words and tree symbols (rarer source words are UNK; the target's are
    # XX already); a word is then the same id and embedding in the source and the target
    # (with signatures every training word left fits: the corpus counts them)
    WORDS=${WORD_VOCAB:-8000}
    if [ "$SIGNATURES" -gt 0 ]; then FITS=$(corpus_info vocabulary); WORDS=$(( WORDS < FITS ? WORDS : FITS )); fi
    VOCAB_ARGS=(--model-type word --vocab-size "$WORDS")
  else
    # the source's BPE pieces; the target's own vocabulary, one id per target symbol (tree
    # symbols, and the written words with SLOTS=words): a shared BPE vocabulary would cut `(NP`
    # into `(` + `NP`
    SYMBOLS=$(corpus_info train_target_symbols)
    VOCAB_ARGS=(--separate-vocab --model-type "$SRC_TYPE" --vocab-size "$SRC_VOCAB"
                --tgt-model-type word --tgt-vocab-size $((SYMBOLS + 4)))
  fi
  $A prepare --src-lang "$SRC_LANG" --tgt-lang tree --train "$OUT/corpus/train" --valid "$OUT/corpus/valid" \
      --test "$OUT/corpus/test" "${VOCAB_ARGS[@]}" --max-len 0 --max-ratio 0 --out "$OUT/data" ${PREPARE_ARGS:-}
  # a checkpoint every 1/30 of the budget: the 5 averaged (n_average) span the last sixth of the run
  for k in $(seq 1 "$ENSEMBLE"); do
    SUFFIX=$(suffix "$k")
    RESUME=""
    [ -e "$OUT/run$SUFFIX/last" ] && RESUME=--resume
    MEMBER=${PRESETS[$(( (k - 1) % ${#PRESETS[@]} ))]}  # NAME or NAME:FIELD=VALUE,FIELD=VALUE
    set_args ""; [[ "$MEMBER" == *:* ]] && set_args "${MEMBER#*:}"
    TRAIN=($A train --data "$OUT/data" --out "$OUT/run$SUFFIX" --preset "${MEMBER%%:*}" "${SET_ARGS[@]}"
           --time-budget "$EACH" --save-minutes "$(awk "BEGIN {print $EACH / 30}")" --eval-every 250
           --eval-bleu-sentences 0 --seed "$k" $RESUME ${TRAIN_ARGS:-})
    member "$OUT/run$SUFFIX.log" "${TRAIN[@]}"
    MODELS+=("$OUT/model$SUFFIX")
  done
  wait_members
  for k in $(seq 1 "$ENSEMBLE"); do
    SUFFIX=$(suffix "$k")
    $A average --run "$OUT/run$SUFFIX" --out "$OUT/model$SUFFIX" --overwrite
  done
fi
for split in $EVAL_SPLITS; do
  VOTES=()
  if [ -n "$VOTERS" ]; then
    mkdir -p "$OUT/votes"
    for m in "$VOTERS"/model "$VOTERS"/model[0-9]*; do
      [ -d "$m" ] || continue
      V="$OUT/votes/$split.$(basename "$m").trees"
      C=--constrained; [ -e "$m/chart.json" ] && C=""
      [ -e "$V" ] || $A parse --model "$m" --input "$OUT/corpus/$split.words" --output "$V" $C
      VOTES+=("$V")
    done
    VOTES=(--votes "${VOTES[@]}" --vote-weight "${VOTE_WEIGHT:-1}")
  fi
  $A parse --model "${MODELS[@]}" --input "$OUT/corpus/$split.words" --output "$OUT/$split.trees" \
      --linearized "$OUT/$split.lin" --overwrite --progress $PARSE_CONSTRAINT "${VOTES[@]}" ${PARSE_ARGS:-} 2>&1 | tee "$OUT/$split.parse.log"
  $A evalb --gold "$OUT/corpus/$split.gold" --test "$OUT/$split.trees" --tags-from-gold > "$OUT/$split.evalb"
  $A evalb --gold "$OUT/corpus/$split.gold" --test "$OUT/$split.trees" --tags-from-gold --json > "$OUT/$split.evalb.json"
done
set +x
for split in $EVAL_SPLITS; do
  echo "== $split: $(tr '\r' '\n' < "$OUT/$split.parse.log" | grep -m1 '^aiayn parse:')"
  grep -A 12 -- "-- All --" "$OUT/$split.evalb" | grep -E "Valid|Recall|Precision|FMeasure|Complete"
  grep -A 12 -- "-- len<=40 --" "$OUT/$split.evalb" | grep -E "FMeasure" | sed 's/^/<=40 words: /'
done
