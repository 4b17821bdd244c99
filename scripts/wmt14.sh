#!/usr/bin/env bash
# The paper's WMT 2014 experiments (§5, §6.1), the whole recipe on one GPU or many:
# download -> prepare -> train (torchrun, bf16) -> average the last checkpoints -> translate
# newstest2014 -> score it (sacreBLEU with its signature, and the paper's tokenized BLEU with
# German compounds split).
#
#   PAIR=en-de MODEL=base bash scripts/wmt14.sh        # EN-DE base on every GPU of this machine
#   PAIR=en-de MODEL=big bash scripts/wmt14.sh         # preset big (P_drop 0.3, 300K steps, average 20)
#   PAIR=en-fr MODEL=big bash scripts/wmt14.sh         # preset big-enfr (P_drop 0.1, §6.1)
#   DRY_RUN=1 PAIR=en-fr MODEL=big bash scripts/wmt14.sh   # print the commands, run nothing
#
# Several machines (NNODES of them, GPUS processes each; the data directory on storage they all
# read, or copied to each): prepare once, train on every node, evaluate on one:
#   STAGES=data bash scripts/wmt14.sh                                         # once
#   STAGES=train NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 bash scripts/wmt14.sh # on node0
#   STAGES=train NNODES=2 NODE_RANK=1 MASTER_ADDR=node0 bash scripts/wmt14.sh # on node1
#   STAGES=eval bash scripts/wmt14.sh                                         # once, after
#
# Batches: an update is the paper's 25,000 source + 25,000 target tokens (the presets'
# max_tokens) whatever the number of GPUs: each GPU's micro-batch holds at most MICRO_TOKENS
# (default 12500) tokens per side, and the updates accumulate ceil(25000 / (MICRO_TOKENS x GPUs))
# micro-batches (2 on one GPU, 1 on two or more). Lower MICRO_TOKENS if a GPU runs out of memory.
# Checkpoints every 10 minutes (§6.1); the last 5 (base) or 20 (big) are averaged. A killed run
# continues from its newest checkpoint when the script is run again.
#
# Settings: PAIR (en-de | en-fr), MODEL (base | big), DATA (download directory), OUT (runs),
# GPUS (processes per node; default: the GPUs nvidia-smi lists), NNODES, NODE_RANK, MASTER_ADDR,
# MASTER_PORT, MICRO_TOKENS, STAGES (data train eval), DEVICE (cuda), TRAIN_ARGS (more `aiayn train` flags, e.g.
# --compile or --max-steps N), TRANSLATE_ARGS, DRY_RUN. On a GPU machine .venv needs a CUDA
# build of torch (scripts/setup.sh installs TORCH_SPEC).
set -euo pipefail
cd "$(dirname "$0")/.."
PAIR=${PAIR:-en-de}; MODEL=${MODEL:-base}
case "$PAIR" in en-de) TGT=de; VOCAB=37000 ;; en-fr) TGT=fr; VOCAB=32000 ;;
  *) echo "PAIR must be en-de or en-fr, not $PAIR" >&2; exit 2 ;; esac
case "$MODEL-$PAIR" in
  base-*) PRESET=base; N_AVG=5 ;;
  big-en-de) PRESET=big; N_AVG=20 ;;
  big-en-fr) PRESET=big-enfr; N_AVG=20 ;;
  *) echo "MODEL must be base or big, not $MODEL" >&2; exit 2 ;; esac
DATA=${DATA:-data/wmt14-$PAIR}
OUT=${OUT:-runs/wmt14-$PAIR-$MODEL}
STAGES=${STAGES:-data train eval}
NNODES=${NNODES:-1}; NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}; MASTER_PORT=${MASTER_PORT:-29500}
if [ -z "${GPUS:-}" ]; then
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  [ "$GPUS" -gt 0 ] 2>/dev/null || GPUS=1
fi
MICRO_TOKENS=${MICRO_TOKENS:-12500}
WORLD=$((NNODES * GPUS))
ACCUM=$(( (25000 + MICRO_TOKENS * WORLD - 1) / (MICRO_TOKENS * WORLD) ))
[ "$ACCUM" -ge 1 ] || ACCUM=1
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu for a smoke test on a machine without GPUs

A=.venv/bin/aiayn
run() { echo "+ $*" >&2; [ -n "${DRY_RUN:-}" ] || "$@"; }
[ -n "${DRY_RUN:-}" ] || bash scripts/setup.sh

if [[ " $STAGES " == *" data "* ]]; then
  run $A download wmt14 --pair "$PAIR" --out "$DATA"
  # the paper: a shared BPE vocabulary of about 37,000 tokens (EN-DE), 32,000 word pieces (EN-FR)
  run $A prepare --src-lang en --tgt-lang "$TGT" --train "$DATA/train" --valid "$DATA/newstest2013" \
      --test "$DATA/newstest2014" --vocab-size "$VOCAB" --out "$OUT/data"
fi

if [[ " $STAGES " == *" train "* ]]; then
  RESUME=""
  [ -e "$OUT/run/last" ] && RESUME=--resume
  # bf16 autocast on the GPU (fp32 weights, optimizer state, softmax and loss); the paper's fp32
  # with TRAIN_ARGS="--precision fp32"
  run .venv/bin/torchrun --nnodes "$NNODES" --nproc_per_node "$GPUS" --node_rank "$NODE_RANK" \
      --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" -m aiayn train \
      --data "$OUT/data" --out "$OUT/run" --preset "$PRESET" --accum "$ACCUM" --precision bf16 \
      --device "$DEVICE" --save-minutes 10 --eval-every 5000 --eval-bleu-sentences 500 \
      $RESUME ${TRAIN_ARGS:-}
fi

if [[ " $STAGES " == *" eval "* ]]; then
  run $A average --run "$OUT/run" --last "$N_AVG" --out "$OUT/model" --overwrite
  run $A translate --model "$OUT/model" --input "$OUT/data/test.src.txt" --output "$OUT/newstest2014.hyp" \
      --device "$DEVICE" --overwrite ${TRANSLATE_ARGS:-}
  # sacreBLEU (detokenized, 13a, with signature) and the paper's tokenized BLEU (Moses-tokenized,
  # German compounds split as tensor2tensor does)
  run $A evaluate --hyp "$OUT/newstest2014.hyp" --ref "$OUT/data/test.tgt.txt" --lang "$TGT"
  if [ -z "${DRY_RUN:-}" ]; then
    $A evaluate --hyp "$OUT/newstest2014.hyp" --ref "$OUT/data/test.tgt.txt" --lang "$TGT" --json \
        > "$OUT/newstest2014.scores.json"
  fi
fi
