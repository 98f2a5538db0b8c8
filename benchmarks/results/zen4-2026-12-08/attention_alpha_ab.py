"""The training attention kernel's scores scaled inside the GEMM (baddbmm alpha) against the current kernel, swapped in
within one process on the BERT-mini bf16 step (21 alternating rounds). Two runs, 01:56 and 01:58 UTC: alpha/cur 0.978
(549.4 against 537.3 ms) and 1.001 (480.7 against 481.4 ms): within the noise, left out."""
import runpy, sys
import torch
sys.argv = ["x", "/tmp/old_packing.py"]
g = runpy.run_path("benchmarks/results/zen4-2026-12-08/step_ab.py")
bm, bp, arms, step, batches = g["bm"], g["bp"], g["arms"], g["step"], g["batches"]
bm.BertForPreTraining.forward, bp.dropout = arms["new"]
cur = bp.attention
def alpha(q, k, v, mask=None, dropout_p=0.0, is_causal=False, kernel="sdpa"):
    if kernel != "math" or not bp._recording(q, k, v) or is_causal:
        return cur(q, k, v, mask, dropout_p, is_causal, kernel)
    B, H, T, D = q.shape
    scores = torch.baddbmm(q.new_zeros(()), q.reshape(B * H, T, D), k.reshape(B * H, T, D).transpose(-1, -2),
                           beta=0, alpha=D ** -0.5).view(B, H, T, T).float()
    if mask is not None:
        scores.add_(mask.float() if mask.dtype != torch.bool else
                    torch.zeros(mask.shape, device=q.device).masked_fill_(~mask, float("-inf")))
    probs = scores.softmax(-1)
    if dropout_p > 0:
        probs = bp.dropout(probs, dropout_p)
    return probs.to(v.dtype) @ v
variants = {"cur": cur, "alpha": alpha}
med = g["alternate"](variants, lambda a: setattr(bm, "attention", a), 21)
print(f"alpha/cur {med['alpha'] / med['cur']:.3f}")
