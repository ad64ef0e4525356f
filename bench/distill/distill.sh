#!/usr/bin/env bash
# Sequence-level distillation on Multi30k EN->DE, end to end (docs/students.md):
#   teacher = the main job's averaged checkpoint (bash scripts/multi30k.sh), decoded in int8;
#   aiayn distill -> the student's data; a student-tiny run on it (2,750 updates, resumable);
#   the same student on the original targets (KD's own gain); test2016/test2017 BLEU of the three at
#   beam 4, alpha 0.6, fp32 and at the beam, alpha and precision aiayn tune chose on validation; decoding speed of
#   the student against CTranslate2 on the same student, and of the teacher (bench/decode/decode_speed.py);
#   results gathered by bench/distill/summarize.py.
# Usage: [SEEDS="1 2"] bash bench/distill/distill.sh [WORK] (default ~/aiayn-work/kdrun); rerunning resumes.
# Each seed trains both students (seed 1 in student/ and student-orig/, seed N in student-sN/, student-orig-sN/).
set -euo pipefail
cd "$(dirname "$0")/../.."
W=${1:-$HOME/aiayn-work/kdrun}
T=${TEACHER:-runs/multi30k-en-de/averaged.safetensors}
PY=".venv/bin/python -m aiayn"
if [ -z "${AIAYN_MULTI30K:-}" ] && [ -d ../shared/data/multi30k ]; then
  export AIAYN_MULTI30K=$(cd ../shared/data/multi30k && pwd)
fi
mkdir -p "$W"
$PY distill --teacher "$T" --corpus multi30k --src en --tgt de -o "$W/data" --precision int8 --beam 4 --alpha 0.6
SEEDS=${SEEDS:-1 2}
run_of() { if [ "$2" = 1 ]; then echo "$1"; else echo "$1-s$2"; fi; }  # a model's folder name in $W, by seed
train_student() {  # NAME DATA SEED: the student-tiny preset at that seed, resumed where it stopped
  if [ -f "$W/$1/config.yaml" ]; then $PY train --resume "$W/$1"; else
    $PY train --data "$2" --run "$W/$1" --preset student-tiny --train.seed "$3"; fi
  $PY average "$W/$1" --last 5 -o "$W/$1/averaged.safetensors"
}
MODELS=teacher
for s in $SEEDS; do
  train_student "$(run_of student "$s")" "$W/data" "$s"
  # distillation's own gain: the same preset, seed and updates on the original targets (the teacher's data)
  train_student "$(run_of student-orig "$s")" "${ORIGINAL_DATA:-work/multi30k-en-de}" "$s"
  MODELS="$MODELS $(run_of student "$s") $(run_of student-orig "$s")"
done
D=$W/data
for m in $MODELS; do
  C=$T; [ $m != teacher ] && C=$W/$m/averaged.safetensors
  # beam, alpha and the precision chosen on validation (aiayn tune), as every model is decoded in use
  [ -f "$W/$m.tuned.safetensors" ] || $PY tune --checkpoint "$C" --data "$D" -o "$W/$m.tuned.safetensors" > "$W/$m.tune.log" 2>&1
  for t in test_2016_flickr test_2017_flickr; do
    $PY translate --checkpoint "$C" -i "$D/$t.en.txt" -o "$W/$m.$t.de" --beam 4 --alpha 0.6 --precision fp32
    $PY score --hyp "$W/$m.$t.de" --ref "$D/$t.de.txt" > "$W/$m.$t.score" 2>&1
    $PY translate --checkpoint "$W/$m.tuned.safetensors" -i "$D/$t.en.txt" -o "$W/$m.tuned.$t.de"
    $PY score --hyp "$W/$m.tuned.$t.de" --ref "$D/$t.de.txt" > "$W/$m.tuned.$t.score" 2>&1
  done
done
.venv/bin/python bench/decode/decode_speed.py --checkpoint "$W/student/averaged.safetensors" --data "$D" \
  --src "$D/test_2016_flickr.en.txt" --ref "$D/test_2016_flickr.de.txt" --reps 3 --latency 100 --unbatched 100 \
  --systems aiayn-fp32,aiayn-int8,aiayn-int8-shortlist,ct2-int8,ct2-float32 --out "$W/student_speed.json"
.venv/bin/python bench/decode/decode_speed.py --checkpoint "$T" --data "$D" --src "$D/test_2016_flickr.en.txt" \
  --ref "$D/test_2016_flickr.de.txt" --systems aiayn-fp32,aiayn-int8 --reps 3 --latency 0 --unbatched 0 \
  --out "$W/teacher_speed.json"
.venv/bin/python bench/distill/summarize.py "$W"
