#!/usr/bin/env bash
# Here, before a GPU run: what bench/gpu/gpu_run.sh needs on a GPU machine that has PyTorch
# but no package registry, in two git-ignored folders that the device call carries:
#   .whl/      CTranslate2 (its CPython 3.12 manylinux wheel: the GPU image's Python) and the two
#              pure-Python dependencies that image lacks (pysbd, sacremoses) — ~43 MB;
#   .gpudata/  Multi30k EN->DE prepared as the main job prepares it (needs ../shared/data/multi30k).
# Then, on the GPU machine: bash bench/gpu/gpu_run.sh (carry .whl and .gpudata).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
grep -qx '/.gpudata/' .git/info/exclude 2>/dev/null || echo '/.gpudata/' >> .git/info/exclude
mkdir -p .whl .gpudata
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl "ctranslate2==${CT2_VERSION:-4.8.5}"
$PY -m pip download -q --no-deps --only-binary=:all: -d .whl pysbd sacremoses
export AIAYN_MULTI30K=${AIAYN_MULTI30K:-$(cd ../shared/data/multi30k && pwd)}
$PY -m aiayn prepare --corpus multi30k --src en --tgt de --out .gpudata/multi30k-en-de --preset multi30k >/dev/null
du -sh .whl .gpudata
