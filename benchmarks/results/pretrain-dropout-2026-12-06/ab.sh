# issue 35: the BERT-mini pre-training step with the CPU dropout as torch.where (before: /work/after at 581f686)
# and as (x * mask) * scale (after: /work/main, uncommitted on e0f7ca8); one machine, alternating; the same benchmark script for both
set -x
date -u; uptime
for round in 1 2 3; do
  for tree in after main; do
    echo "== $tree $(git -C /work/$tree rev-parse --short HEAD) $(git -C /work/$tree diff --stat -- src | tail -1) round $round"
    PYTHONPATH=/work/$tree/src timeout 400 /work/main/.venv/bin/python /work/main/benchmarks/pretrain_vs_hf.py --sizes mini --reps 5 2>&1 | grep -E "^mini|^batches"
  done
done
date -u
