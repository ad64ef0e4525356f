#!/usr/bin/env bash
# §6.3 on the Penn Treebank sample (NLTK's 3,914 WSJ trees), end to end on this machine:
#   prepare (words -> linearized trees with the words as leaves; split by file: 0001-0159 / 0160-0179 /
#   0180-0199) -> train the `parse` preset (60 minutes) -> average the last 5 checkpoints
#   -> parse the validation and test splits with the tree-constrained search (the preset's beam and alpha)
#   and without it (--free) -> EVALB F1, beside two baselines on the same split: right-branching and a
#   treebank PCFG read off the training trees (given the gold tags).
# Treebank: $TREEBANK, else ../shared/data/ptb-sample/treebank.zip, else NLTK's public copy.
# Extra arguments are config overrides for training, e.g. --train.max_minutes 10.
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
$AIAYN prepare --task parse --treebank "$TREEBANK" -o "$DATA" --preset parse >/dev/null
if [ -f "$RUN/config.yaml" ]; then
  $AIAYN train --resume "$RUN" "$@"
else
  $AIAYN train --data "$DATA" --run-dir "$RUN" --preset parse "$@"
fi
$AIAYN average --run-dir "$RUN" --last 5 -o "$RUN/averaged.safetensors"
for split in valid test; do
  $AIAYN parse --checkpoint "$RUN/averaged.safetensors" -i "$DATA/$split.words.txt" -o "$RUN/$split.parsed.mrg"
  $AIAYN parse --free --checkpoint "$RUN/averaged.safetensors" -i "$DATA/$split.words.txt" -o "$RUN/$split.free.mrg"
done
for split in valid test; do
  echo "== PTB sample $split split, averaged last 5 checkpoints, tree-constrained search =="
  $AIAYN score --parse --hyp "$RUN/$split.parsed.mrg" --ref "$DATA/$split.gold.mrg"
  echo "== same model, free search (aiayn parse --free), repaired =="
  $AIAYN score --parse --hyp "$RUN/$split.free.mrg" --ref "$DATA/$split.gold.mrg"
done
echo "== baselines on the test split: right-branching; treebank PCFG from the training trees (gold tags) =="
$AIAYN score --parse --right-branching --ref "$DATA/test.gold.mrg"
$AIAYN score --parse --pcfg "$DATA/train.gold.mrg" --ref "$DATA/test.gold.mrg"
