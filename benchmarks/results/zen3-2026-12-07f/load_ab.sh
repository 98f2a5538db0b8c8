# Predictor.from_dir of all-MiniLM-L6-v2 in fresh processes, two source trees alternating, 6 rounds:
# seconds with small_batches=False, then with the default (the recorded short-batch engine built and checked).
# usage (from the repository root, a measurements file of an earlier start in BERTKIT_CACHE_DIR):
#   OLD=/path/to/old/src NEW=src PYTHON=.venv/bin/python bash benchmarks/results/zen3-2026-12-07f/load_ab.sh
for r in 1 2 3 4 5 6; do for v in old new; do
  src=$NEW; [ $v = old ] && src=$OLD
  PYTHONPATH=$src ${PYTHON:-python} -c "
import time,sys; sys.path.insert(0,'benchmarks')
from infer_vs_hf import minilm_dir
import bertkit, bertkit.infer as bi
t=time.perf_counter(); p = bi.Predictor.from_dir(minilm_dir(), device='cpu', small_batches=False); t1=time.perf_counter(); q = bi.Predictor.from_dir(minilm_dir(), device='cpu'); t2=time.perf_counter()
print('$v', bertkit.__file__[:12], f'{t1-t:.2f} {t2-t1:.2f}')" 2>&1 | grep -v Warn
done; done
