#!/usr/bin/env bash
# The whole reproduction report, in an order that makes a partial report worth reading: the reference
# seeds, the architecture families (with seeds 2 and 3 of the Transformer and of each family's best),
# Table 3's headline rows, the depth group, the remaining rows, second seeds of rows near the line, every
# family tuned on validation (rate x clipping, then seeds at each choice), those compared runs again at
# the beam and alpha each chose on validation, the budget run, Table 1.
# About 85 hours of training on a 2-core CPU (REPORT.md's "Compute spent" sums what the committed runs
# recorded); resumable: re-run to continue. Each step re-renders REPORT.md.
#   bash scripts/report.sh [aiayn reproduce options, e.g. --report DIR --work DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
R="bash scripts/reproduce.sh"
$R table3 --rows ref "$@"
$R arch "$@"
$R table3 --rows A-h1,A-h16,B-dk16,C-dmodel128,C-dmodel512,D-pdrop0.0,D-ls0.0,E "$@"
$R table3 --rows C-N1,C-N2,C-N6,depth-ref-s1,depth-ref-s2,depth-ref-s3,depth-ref-s4,depth-ref-s5 "$@"
$R table3 --rows A-h2,A-h8,B-dk32,C-dff512,C-dff2048,D-pdrop0.1,D-pdrop0.3,D-ls0.2 "$@"
$R table3 "$@"  # every row done: the second seeds (--extra-seeds, default 12) and the paired tests
$R tune "$@"    # the families' fair comparison: each tuned on validation, 3 seeds at its choice
$R decode "$@"  # the same compared runs again, each at the beam and alpha chosen on its validation set
$R budget "$@"  # the reference trained to 6,000 updates: where the suites' 2,750 comes from
$R table1 "$@"  # timings: run it when nothing else runs (the report records the load average)
