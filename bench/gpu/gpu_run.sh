#!/usr/bin/env bash
# On a GPU machine, from the working tree, after bench/gpu/gpu_carry.sh made .whl and .gpudata
# here: installs the carried wheels into /tmp/site, lets CTranslate2's CUDA 12 build load a CUDA 13
# cuBLAS (libcublas.so.12 -> libcublas.so.13 links in /tmp/cu12: the only difference it meets, seen
# working on an H200), runs bench/gpu/gpu.py and leaves its JSON, log and the runs' logs in OUT.
#   OUT=/some/dir bash bench/gpu/gpu_run.sh [bench/gpu/gpu.py options, e.g. --budget-s 480, --decode-only or --training-only]
# (python3 is the machine's, the one with PyTorch; the device tool's call: carry .whl and .gpudata,
# command `OUT=$OUT bash bench/gpu/gpu_run.sh --budget-s 480`, timeout 560: a GPU lease is 15 minutes, start included.)
#   BENCH=compile_shapes OUT=/some/dir bash bench/gpu/gpu_run.sh --preset base --max-tokens 8192
# runs bench/train/compile_shapes.py instead; BENCH=compile_probe runs bench/decode/compile_probe.py (no trained model needed) (train.compile's bucketed shapes against automatic dynamic ones).
# LIMIT_S (default 530 for the bench, 585 for compile_shapes) ends the Python run early enough, inside the
# device call's 560 s, for the logs to be packed (GPU run 3's call ended inside decoding and packed none).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-out}
WORK=${WORK:-/tmp/aiayn-gpu-work}
mkdir -p "$OUT" /tmp/cu12
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/smi.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > "$OUT/pip.txt" 2>&1 || echo "wheels not installed (see pip.txt): peers will be skipped"
export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
for lib in libcublas libcublasLt; do
  found=$(find /opt /usr/local /usr/lib -name "$lib.so.13*" 2>/dev/null | head -1)
  [ -n "$found" ] && ln -sf "$found" "/tmp/cu12/$lib.so.12"
done
export LD_LIBRARY_PATH=/tmp/cu12${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if [ "${BENCH:-gpu}" = compile_probe ]; then  # the compiled decoding step's graphs and cost (bench/decode/compile_probe.py)
  TORCH_LOGS=recompiles PYTHONUNBUFFERED=1 timeout "${LIMIT_S:-230}" python3 bench/decode/compile_probe.py \
    --data .gpudata/multi30k-en-de --device cuda --out "$OUT/probe.json" "$@" 2>&1 | grep -v '^ *$' > "$OUT/log.txt"
  rc=${PIPESTATUS[0]}
  cut -c1-300 "$OUT/log.txt" | tail -40
  exit "$rc"
fi
if [ "${BENCH:-gpu}" = compile_shapes ]; then
  PYTHONUNBUFFERED=1 timeout "${LIMIT_S:-585}" python3 bench/train/compile_shapes.py --data .gpudata/multi30k-en-de \
    --device cuda --out "$OUT/compile_shapes.json" "$@" 2>&1 | tee "$OUT/log.txt" | grep -v Warning
  exit "${PIPESTATUS[0]}"
fi
PYTHONUNBUFFERED=1 timeout "${LIMIT_S:-530}" python3 bench/gpu/gpu.py --data .gpudata/multi30k-en-de \
  --out "$OUT/gpu.json" --work "$WORK" "$@" > "$OUT/log.txt" 2>&1
rc=$?
(cd "$WORK" && tar czf "$OUT/logs.tgz" ./*.log) 2>/dev/null
grep -E '^\[' "$OUT/log.txt" | cut -c1-600
exit $rc
