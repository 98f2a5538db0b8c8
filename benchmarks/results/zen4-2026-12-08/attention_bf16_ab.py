"""The training attention kernel with scores, mask, softmax and dropout in bf16 end to end (the arm called 'alpha' in
the output) against the current kernel (fp32 scores and softmax), swapped in within one process on the BERT-mini bf16
step, 21 alternating rounds. 02:00 UTC: 488.4 against 477.9 ms, 0.979x: about the run-to-run noise; not taken."""
import runpy, sys, statistics, time
import torch
sys.argv = ["x", "/tmp/old_packing.py", "1"]
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
for k, a in variants.items():
    bm.attention = a
    for b in batches: step(b)
times = {k: [] for k in variants}
for r in range(21):
    for k in (list(variants) if r % 2 == 0 else list(reversed(variants))):
        bm.attention = variants[k]
        t0 = time.perf_counter()
        for b in batches: step(b)
        times[k].append(time.perf_counter() - t0)
for k, v in times.items(): print(k, f"{statistics.median(v)/2*1e3:.1f} ms a step")
print(f"alpha/cur {statistics.median(times['alpha'])/statistics.median(times['cur']):.3f}")
