"""The MLM decoder's bias added inside the loss (the GEMM without bias, the bias added to each 16-row fp32 chunk and
its gradient summed there) against the current head + loss, swapped in within one process on the BERT-mini bf16
step, 21 alternating rounds. 02:01 UTC: 479.1 against 480.7 ms, 1.003x: no gain, left out."""
import runpy, sys
import torch, torch.nn.functional as F
sys.argv = ["x", "/tmp/old_packing.py"]
g = runpy.run_path("benchmarks/results/zen4-2026-12-08/step_ab.py")
bm, bp, arms, step, batches = g["bm"], g["bp"], g["arms"], g["step"], g["batches"]
cur_forward, bp.dropout = arms["new"]

class CEBias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, bias):
        M = len(targets)
        picked = torch.empty(M)
        g = torch.empty_like(logits); g[M:].zero_()
        gb = torch.zeros(bias.shape, dtype=torch.float32)
        for a in range(0, M, 16):
            b = min(a + 16, M)
            rows, t, at = torch.add(logits[a:b], bias), targets[a:b], torch.arange(b - a)
            p = torch.softmax(rows, -1)
            picked[a:b] = p[at, t]
            p[at, t] -= 1
            p.mul_(1 / M)
            gb += p.sum(0)
            g[a:b] = p
        ctx.save_for_backward(g, gb)
        return -picked.log().mean()
    @staticmethod
    def backward(ctx, up):
        g, gb = ctx.saved_tensors
        return g, None, gb.to(torch.float32)

def bias_forward(self, input_ids, token_type_ids=None, attention_mask=None, mlm_labels=None, nsp_labels=None,
                 packed=None, position_ids=None):
    h = self.bert(input_ids, token_type_ids, attention_mask, position_ids, packed)
    out = {}
    h_masked, targets = bm.select_masked(h, mlm_labels)
    m = self.mlm
    logits = bp.on_gemm_rows(h_masked, lambda x: F.linear(m.norm(m.act(m.dense(x))), m.decoder.weight), cut=False)
    out["mlm_loss"] = CEBias.apply(logits, targets, m.bias)
    out["nsp_loss"] = F.cross_entropy(self.nsp(self.bert.pool(h, packed, attention_mask)).float(), nsp_labels)
    out["loss"] = out["mlm_loss"] + out["nsp_loss"]
    return out

variants = {"cur": cur_forward, "bias": bias_forward}
med = g["alternate"](variants, lambda f: setattr(bm.BertForPreTraining, "forward", f), 21)
print(f"bias/cur {med['bias'] / med['cur']:.3f}")
