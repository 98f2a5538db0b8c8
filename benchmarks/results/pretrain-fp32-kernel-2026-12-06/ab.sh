# issue 35: the BERT-mini pre-training step in fp32 with the training attention kernel chosen on a mask
# like the model's (after: /work/after) against one chosen on an ALiBi-style mask (before: /work/before at
# 7eb769f); one machine, alternating; the same benchmark script for both. Each tree's choice is measured
# once into its own cache directory.
set -x
date -u; uptime
for round in 1 2 3; do
  for tree in before after; do
    echo "== $tree $(git -C /work/$tree rev-parse --short HEAD) $(git -C /work/$tree diff --stat -- src | tail -1) round $round"
    BERTKIT_CACHE_DIR=/tmp/cache-$tree PYTHONPATH=/work/$tree/src timeout 400 /work/main/.venv/bin/python /work/main/benchmarks/pretrain_vs_hf.py --sizes mini --reps 5 --precision fp32 2>&1 | grep -E "^mini|^batches"
  done
done
date -u
