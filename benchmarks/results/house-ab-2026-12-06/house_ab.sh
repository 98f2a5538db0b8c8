# issue 33: speed before and after the passes of shorter code, one machine, alternating; each tree runs its own
# benchmarks and its own src. before/after: 8a95d92 / a443936, then 8a95d92 / c4d5311, then 8ebedf1 / 581f686
set -x
date -u; uptime
for round in 1 2; do
  for tree in before after; do
    cd /work/$tree; echo "== $tree $(git rev-parse --short HEAD) round $round"
    PYTHONPATH=/work/$tree/src timeout 300 /work/main/.venv/bin/python benchmarks/infer_vs_hf.py --reps 5 --threads 2 --only none 2>&1 | grep -E "^\| (transformers|bertkit)|^\{" | cut -c1-200
  done
done
for round in 1 2; do
  for tree in before after; do
    cd /work/$tree; echo "== $tree $(git rev-parse --short HEAD) pretrain round $round"
    PYTHONPATH=/work/$tree/src timeout 400 /work/main/.venv/bin/python benchmarks/pretrain_vs_hf.py --sizes mini --reps 3 2>&1 | grep -E "^mini"
  done
done
date -u
