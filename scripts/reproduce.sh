#!/usr/bin/env bash
# The paper's evidence at small scale: bash scripts/reproduce.sh SUITE [aiayn reproduce options]
#   SUITE: budget (the reference trained long: the update budget), table3 (Table 3 rows), arch
#   (Transformer vs recurrent and convolutional models), tune (every family's rate and clipping), table1, quick.
# Prepares Multi30k EN->DE like the main job, runs the suite (resumable: re-run to continue),
# and writes docs/reproduction/REPORT.md. Run directories go to $WORK (default runs/reproduce).
set -euo pipefail
cd "$(dirname "$0")/.."
SUITE=${1:?usage: bash scripts/reproduce.sh budget|table3|arch|tune|table1|quick [options]}
shift
AIAYN=${AIAYN:-.venv/bin/aiayn}  # e.g. "python -m aiayn" from a worktree
DATA=${DATA:-work/multi30k-en-de}
WORK=${WORK:-runs/reproduce}
if [ -z "${AIAYN_MULTI30K:-}" ] && [ -d ../shared/data/multi30k ]; then
  export AIAYN_MULTI30K=$(cd ../shared/data/multi30k && pwd)
fi
if [ "$SUITE" != table1 ]; then
  $AIAYN prepare --corpus multi30k --src en --tgt de --out "$DATA" --preset multi30k >/dev/null
  exec $AIAYN reproduce --suite "$SUITE" --data "$DATA" --work "$WORK" "$@"
fi
exec $AIAYN reproduce --suite table1 --work "$WORK" "$@"
