for r in 1 2 3 4 5 6; do for v in old new; do
  src=/work/main/src; [ $v = old ] && src=/tmp/w/old/src
  BERTKIT_CACHE_DIR=/tmp/w/cache PYTHONPATH=$src /work/main/.venv/bin/python -c "
import time,sys; sys.path.insert(0,'/work/main/benchmarks')
from infer_vs_hf import minilm_dir
import bertkit, bertkit.infer as bi
t=time.perf_counter(); p = bi.Predictor.from_dir(minilm_dir(), device='cpu', small_batches=False); t1=time.perf_counter(); q = bi.Predictor.from_dir(minilm_dir(), device='cpu'); t2=time.perf_counter()
print('$v', bertkit.__file__[:12], f'{t1-t:.2f} {t2-t1:.2f}')" 2>&1 | grep -v Warn
done; done
