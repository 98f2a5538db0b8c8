"""The training attention kernel with scores, mask, softmax and dropout in bf16 end to end (the arm called 'alpha' in
the output) against the current kernel (fp32 scores and softmax), swapped in within one process on the BERT-mini bf16
step, 21 alternating rounds. 02:00 UTC: 488.4 against 477.9 ms, 0.979x: about the run-to-run noise; not taken."""
import runpy, sys
import torch
sys.argv = ["x", "/tmp/old_packing.py"]
g = runpy.run_path("benchmarks/results/zen4-2026-12-08/step_ab.py")
bm, bp, arms, step, batches = g["bm"], g["bp"], g["arms"], g["step"], g["batches"]
bm.BertForPreTraining.forward, bp.dropout = arms["new"]
cur = bp.attention
def bf16(q, k, v, mask=None, dropout_p=0.0, is_causal=False, kernel="sdpa"):
    if kernel != "math" or not bp._recording(q, k, v) or is_causal:
        return cur(q, k, v, mask, dropout_p, is_causal, kernel)
    B, H, T, D = q.shape
    scores = torch.baddbmm(q.new_zeros(()), q.reshape(B * H, T, D), k.reshape(B * H, T, D).transpose(-1, -2),
                           beta=0, alpha=D ** -0.5).view(B, H, T, T)
    if mask is not None:
        scores.add_(mask.to(scores.dtype) if mask.dtype != torch.bool else
                    torch.zeros(mask.shape, device=q.device, dtype=scores.dtype).masked_fill_(~mask, float("-inf")))
    probs = scores.softmax(-1)
    if dropout_p > 0:
        probs = bp.dropout(probs, dropout_p)
    return probs @ v
variants = {"cur": cur, "alpha": bf16}
med = g["alternate"](variants, lambda a: setattr(bm, "attention", a), 21)
print(f"alpha/cur {med['alpha'] / med['cur']:.3f}")
