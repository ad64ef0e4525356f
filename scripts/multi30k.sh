#!/usr/bin/env bash
# The main job: Multi30k EN->DE on this machine's CPU, end to end.
#   prepare (joint BPE, §5.1) -> train the `multi30k` preset for 2,750 updates (§5), in bf16 where the
#   CPU computes it natively, else fp32 (train.precision auto): the same model on every CPU, only the time differs
#   -> average the last 5 checkpoints (§6.1) -> beam-4 translation of test2016 -> sacreBLEU,
#   and again with beam size and alpha tuned on the validation set (aiayn tune, §6.1).
# Data: $AIAYN_MULTI30K, else ../shared/data/multi30k beside the repository, else downloaded.
# Extra arguments are config overrides for training, e.g. --train.max_steps 1000.
# Re-running continues an unfinished run (aiayn train --resume).
set -euo pipefail
cd "$(dirname "$0")/.."
AIAYN=.venv/bin/aiayn
SRC=${SRC:-en}; TGT=${TGT:-de}
RUN=${RUN:-runs/multi30k-$SRC-$TGT}
DATA=${DATA:-work/multi30k-$SRC-$TGT}
if [ -z "${AIAYN_MULTI30K:-}" ] && [ -d ../shared/data/multi30k ]; then
  export AIAYN_MULTI30K=$(cd ../shared/data/multi30k && pwd)
fi
$AIAYN prepare --corpus multi30k --src "$SRC" --tgt "$TGT" --out "$DATA" --preset multi30k >/dev/null
if [ -f "$RUN/config.yaml" ]; then
  $AIAYN train --resume "$RUN" "$@"
else
  $AIAYN train --data "$DATA" --run "$RUN" --preset multi30k "$@"
fi
$AIAYN average "$RUN" --last 5 -o "$RUN/averaged.safetensors"
# §6.1: beam size and alpha chosen on the validation set (never the test set)
$AIAYN tune --checkpoint "$RUN/averaged.safetensors" -o "$RUN/tuned.safetensors"
TEST=test_2016_flickr
$AIAYN translate --checkpoint "$RUN/averaged.safetensors" --input "$DATA/$TEST.$SRC.txt" \
  --output "$RUN/$TEST.$TGT.hyp" --beam 4 --alpha 0.6
$AIAYN translate --checkpoint "$RUN/tuned.safetensors" --input "$DATA/$TEST.$SRC.txt" \
  --output "$RUN/$TEST.$TGT.tuned.hyp"
echo "== $TEST $SRC->$TGT, averaged last 5 checkpoints, beam 4, alpha 0.6 (sacreBLEU, detokenized, cased) =="
$AIAYN score --hyp "$RUN/$TEST.$TGT.hyp" --ref "$DATA/$TEST.$TGT.txt"
echo "== the same with the beam and alpha tuned on the validation set =="
$AIAYN score --hyp "$RUN/$TEST.$TGT.tuned.hyp" --ref "$DATA/$TEST.$TGT.txt"
