#!/usr/bin/env bash
# Sequence-level distillation on Multi30k EN->DE, end to end (docs/students.md):
#   teacher = the main job's averaged checkpoint (bash scripts/multi30k.sh), decoded in int8;
#   aiayn distill -> the student's data; a student-tiny run on it (2,750 updates, resumable);
#   test2016/test2017 BLEU of teacher and student (beam 4, alpha 0.6, fp32); then decoding speed of
#   the student against CTranslate2 on the same student, and of the teacher (bench/decode/decode_speed.py);
#   results gathered by bench/distill/summarize.py.
# Usage: bash bench/distill/distill.sh [WORK] (default ~/aiayn-work/kdrun); rerunning resumes.
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
if [ -f "$W/student/config.yaml" ]; then $PY train --resume "$W/student"; else
  $PY train --data "$W/data" --run "$W/student" --preset student-tiny; fi
$PY average "$W/student" --last 5 -o "$W/student/averaged.safetensors"
D=$W/data
for m in teacher student; do
  C=$T; [ $m = student ] && C=$W/student/averaged.safetensors
  for t in test_2016_flickr test_2017_flickr; do
    $PY translate --checkpoint "$C" -i "$D/$t.en.txt" -o "$W/$m.$t.de" --beam 4 --alpha 0.6 --precision fp32
    $PY score --hyp "$W/$m.$t.de" --ref "$D/$t.de.txt" > "$W/$m.$t.score" 2>&1
  done
done
.venv/bin/python bench/decode/decode_speed.py --checkpoint "$W/student/averaged.safetensors" --data "$D" \
  --src "$D/test_2016_flickr.en.txt" --ref "$D/test_2016_flickr.de.txt" --reps 3 --latency 100 --unbatched 100 \
  --systems aiayn-fp32,aiayn-int8,aiayn-int8-shortlist,ct2-int8,ct2-float32 --out "$W/student_speed.json"
.venv/bin/python bench/decode/decode_speed.py --checkpoint "$T" --data "$D" --src "$D/test_2016_flickr.en.txt" \
  --ref "$D/test_2016_flickr.de.txt" --systems aiayn-fp32,aiayn-int8 --reps 3 --latency 0 --unbatched 0 \
  --out "$W/teacher_speed.json"
.venv/bin/python bench/distill/summarize.py "$W"
