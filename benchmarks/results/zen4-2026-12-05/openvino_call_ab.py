"""OpenVINOGraph.run's call, before and after 628fa90, in one process: the encoder graph of all-MiniLM-L6-v2
on 1 x 16 tokens, 21 interleaved rounds of 300 calls (min and median ms per call).

    python benchmarks/results/zen4-2026-12-05/openvino_call_ab.py
"""
import sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import numpy as np, torch
import infer_vs_hf as B
from bertkit.infer import Predictor
from bertkit.tokenizer import Tokenizer
import openvino as ov
torch.set_num_threads(2)
path = B.minilm_dir()
tok = Tokenizer.from_dir(path)
b = B.make_inputs(tok, [16])
pred = Predictor.from_dir(path, device="cpu")
R = pred.small.runner
req, comp = R.request, R.compiled
out0 = comp.outputs[0]
bt = pred.batches(b["rows"])[0]
with torch.inference_mode():
    x = pred.small.bert.embeddings(bt.tensors["input_ids"], bt.tensors["token_type_ids"], bt.tensors["position_ids"]).float()[None].numpy()
m = np.ones((1, 16), np.int64)
def a():
    out = req.infer([x, m]); return np.array(out[comp.outputs[0]])   # the call before 628fa90
def b_(): 
    r = req.infer({0: x, 1: m}, share_inputs=True, share_outputs=True); return np.array(r[0])
def c():
    req.set_input_tensor(0, ov.Tensor(x, shared_memory=True)); req.set_input_tensor(1, ov.Tensor(m, shared_memory=True))
    req.infer(); return req.get_output_tensor(0).data.copy()
def d():
    req.set_input_tensor(0, ov.Tensor(x, shared_memory=True)); req.set_input_tensor(1, ov.Tensor(m, shared_memory=True))
    req.start_async(); req.wait(); return req.get_output_tensor(0).data.copy()
ref = a()
for f in (b_, c, d): assert np.array_equal(f(), ref), f
def t(f, n=300):
    time.sleep(0.3); f()
    t0 = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - t0) / n * 1e3
fs = {"before 628fa90: infer([x, m]), output by port": a, "628fa90: infer({0: x, 1: m}, share_inputs, share_outputs)": b_}
res = {k: [] for k in fs}
for r in range(21):
    for k, f in fs.items(): res[k].append(t(f))
for k, v in res.items(): print(f"{min(v):8.3f} ms (median {np.median(v):.3f})  {k}")
