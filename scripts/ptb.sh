#!/usr/bin/env bash
# §6.3 on the Penn Treebank sample (NLTK's 3,914 WSJ trees), end to end on this machine:
#   prepare (words -> linearized trees with the words as leaves; split by file: 0001-0159 / 0160-0179 /
#   0180-0199; every word tagged by a part-of-speech tagger trained on the training trees, the training
#   words jackknifed) -> train two parsers of the `parse` preset (seeds 1 and 2) side by side, 4,900 updates each
#   -> average each one's last 5 checkpoints -> parse the validation and test splits with their ensemble,
#   with the tree-constrained search (the preset's beam and alpha)
#   and without it (--free) -> EVALB F1, beside two baselines on the same split: right-branching and a
#   treebank PCFG read off the training trees (given the gold tags).
# Treebank: $TREEBANK, else ../shared/data/ptb-sample/treebank.zip, else NLTK's public copy.
# Extra arguments are config overrides for training, e.g. --train.max_steps 1000.
# MEMBERS=N (default 2, chosen on the development split) trains N parsers with seeds 1..N side by side in
# $RUN/member1..N, the cores shared out among them, each for the preset's 4,900 updates, and parses with their
# ensemble (aiayn parse --checkpoint A B); MEMBERS=1 trains one parser in $RUN on every core.
# Re-running continues an unfinished run (aiayn train --resume).
set -euo pipefail
cd "$(dirname "$0")/.."
AIAYN=.venv/bin/aiayn
RUN=${RUN:-runs/ptb-parse}
DATA=${DATA:-work/ptb-parse}
TREEBANK=${TREEBANK:-../shared/data/ptb-sample/treebank.zip}
if [ ! -e "$TREEBANK" ]; then
  TREEBANK=${AIAYN_CACHE:-$HOME/.cache/aiayn}/ptb-sample/treebank.zip
  if [ ! -f "$TREEBANK" ]; then
    mkdir -p "$(dirname "$TREEBANK")"
    echo "downloading NLTK's Penn Treebank sample (non-commercial use) to $TREEBANK"
    curl -fsSL -o "$TREEBANK.part" https://raw.githubusercontent.com/nltk/nltk_data/gh-pages/packages/corpora/treebank.zip
    mv "$TREEBANK.part" "$TREEBANK"
  fi
fi
MEMBERS=${MEMBERS:-2}
$AIAYN prepare --task parse --treebank "$TREEBANK" -o "$DATA" --preset parse >/dev/null
train_one() {  # RUN_DIR [overrides...]: train (or continue) one parser, then average its last 5 checkpoints
  local run=$1
  shift
  if [ -f "$run/config.yaml" ]; then
    $AIAYN train --resume "$run" "$@"
  else
    $AIAYN train --data "$DATA" --run-dir "$run" --preset parse "$@"
  fi
  $AIAYN average --run-dir "$run" --last 5 -o "$run/averaged.safetensors"
}
CKPTS=()
if [ "$MEMBERS" -le 1 ]; then
  train_one "$RUN" "$@"
  CKPTS=("$RUN/averaged.safetensors")
else  # an ensemble: MEMBERS seeds trained side by side, the cores shared out, decoded together
  mkdir -p "$RUN"
  THREADS=$(( $(nproc) / MEMBERS > 0 ? $(nproc) / MEMBERS : 1 ))
  pids=()
  for k in $(seq 1 "$MEMBERS"); do
    echo "training member $k of $MEMBERS ($THREADS thread(s)); log: $RUN/member$k.log"
    train_one "$RUN/member$k" --train.seed "$k" --train.threads "$THREADS" "$@" > "$RUN/member$k.log" 2>&1 &
    pids+=($!)
    CKPTS+=("$RUN/member$k/averaged.safetensors")
  done
  for k in "${!pids[@]}"; do
    wait "${pids[$k]}" || { echo "member $((k + 1)) failed: see $RUN/member$((k + 1)).log" >&2; exit 1; }
  done
fi
for split in valid test; do
  $AIAYN parse --checkpoint "${CKPTS[@]}" -i "$DATA/$split.words.txt" -o "$RUN/$split.parsed.mrg"
  $AIAYN parse --free --checkpoint "${CKPTS[@]}" -i "$DATA/$split.words.txt" -o "$RUN/$split.free.mrg"
done
for split in valid test; do
  echo "== PTB sample $split split, ${#CKPTS[@]} parser(s), each its last 5 checkpoints averaged, tree-constrained search =="
  $AIAYN score --parse --hyp "$RUN/$split.parsed.mrg" --ref "$DATA/$split.gold.mrg"
  echo "== same model, free search (aiayn parse --free), repaired =="
  $AIAYN score --parse --hyp "$RUN/$split.free.mrg" --ref "$DATA/$split.gold.mrg"
done
echo "== baselines on the test split: right-branching; treebank PCFG from the training trees (gold tags) =="
$AIAYN score --parse --right-branching --ref "$DATA/test.gold.mrg"
$AIAYN score --parse --pcfg "$DATA/train.gold.mrg" --ref "$DATA/test.gold.mrg"
