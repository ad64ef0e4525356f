#!/usr/bin/env bash
# The paper's base run on WMT14 EN->DE, end to end (§5, §6.1):
#   prepare (Europarl v7 + Common Crawl + News Commentary v9, newstest2013, newstest2014; joint BPE of
#   37k) -> train `base` for 100k updates of ~25,000 target tokens (torchrun on every GPU present)
#   -> average the last 5 checkpoints (written every 10 minutes) -> beam 4, alpha 0.6, max length
#   source + 50 on newstest2014 -> sacreBLEU and the paper's tokenized BLEU.
# Needs CUDA GPUs (the paper: 8 P100 for 12 hours); on a CPU it would take months, so it refuses
# unless AIAYN_ALLOW_CPU=1. Archives: $AIAYN_WMT14 (a folder of the official .tgz files), else
# downloaded (about 1.7 GB). Extra arguments are config overrides for training. Re-running
# continues an unfinished run (aiayn train --resume).
set -euo pipefail
cd "$(dirname "$0")/.."
AIAYN=.venv/bin/aiayn
RUN=${RUN:-runs/wmt14-en-de}
DATA=${DATA:-work/wmt14-en-de}
PRECISION=${PRECISION:-bf16}  # bf16 autocast (fp32 weights, logits and loss); fp32 is the paper's arithmetic
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${GPUS:-0}" -eq 0 ] && [ -z "${AIAYN_ALLOW_CPU:-}" ]; then
  echo "scripts/wmt14.sh: no CUDA GPU found; the base run takes about 100 GPU-hours of P100 time." >&2
  echo "Set AIAYN_ALLOW_CPU=1 to run it on the CPU anyway." >&2
  exit 2
fi
# AIAYN_TRUST_LOCAL=1: use local archives whose checksums differ from the official ones
$AIAYN prepare --corpus wmt14-en-de --src en --tgt de --out "$DATA" --preset base ${AIAYN_TRUST_LOCAL:+--trust-local}
if [ -f "$RUN/config.yaml" ]; then
  ARGS=(--resume "$RUN" "$@")
else
  ARGS=(--data "$DATA" --run-dir "$RUN" --preset base --train.precision "$PRECISION" "$@")
fi
if [ "${GPUS:-0}" -gt 1 ]; then
  .venv/bin/torchrun --standalone --nproc_per_node "$GPUS" -m aiayn train "${ARGS[@]}"
else
  $AIAYN train "${ARGS[@]}"
fi
$AIAYN average "$RUN" -o "$RUN/averaged.safetensors"  # the run's keep_last: 5 for base
$AIAYN translate --checkpoint "$RUN/averaged.safetensors" --input "$DATA/newstest2014.en.txt" \
  --output "$RUN/newstest2014.de.hyp" --beam 4 --alpha 0.6 --max-len-b 50
echo "== newstest2014 EN->DE, averaged last 5 checkpoints, beam 4, alpha 0.6 =="
$AIAYN score --hyp "$RUN/newstest2014.de.hyp" --ref "$DATA/newstest2014.de.txt" --paper --lang de
