# issue 33: speed before (2b7cc63) and after (HEAD) the redesign, one machine, alternating
set -x
date -u; uptime
for round in 1 2; do
  for tree in before main; do
    cd /work/$tree; echo "== $tree $(git rev-parse --short HEAD) round $round"
    PYTHONPATH=/work/$tree/src timeout 300 /work/main/.venv/bin/python benchmarks/infer_vs_hf.py --reps 5 --threads 2 --only none 2>&1 | grep -E "^\| (transformers|bertkit)|^\{" | cut -c1-200
  done
done
for tree in before main; do
  cd /work/$tree; echo "== $tree $(git rev-parse --short HEAD) pretrain"
  PYTHONPATH=/work/$tree/src timeout 400 /work/main/.venv/bin/python benchmarks/pretrain_vs_hf.py --sizes mini --reps 3 2>&1 | grep -v -i "warn\|Loading" | tail -8
done
date -u
