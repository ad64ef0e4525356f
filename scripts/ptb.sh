#!/usr/bin/env bash
# §6.3 on the Penn Treebank sample (NLTK's 3,914 WSJ trees), end to end on this machine:
#   prepare (words -> linearized trees, split by file: 0001-0159 / 0160-0179 / 0180-0199)
#   -> train the `parse` preset for 30 minutes -> average the last 5 checkpoints
#   -> parse the test split (beam 21, alpha 0.3, max length input + 300) -> EVALB F1,
#   and the right-branching baseline on the same split for scale.
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
$AIAYN parse --checkpoint "$RUN/averaged.safetensors" -i "$DATA/test.words.txt" -o "$RUN/test.parsed.mrg"
echo "== PTB sample test split (wsj_0180-0199), averaged last 5 checkpoints, beam 21, alpha 0.3 =="
$AIAYN score --parse --hyp "$RUN/test.parsed.mrg" --ref "$DATA/test.gold.mrg"
echo "== right-branching baseline, same split =="
$AIAYN score --parse --right-branching --ref "$DATA/test.gold.mrg"
