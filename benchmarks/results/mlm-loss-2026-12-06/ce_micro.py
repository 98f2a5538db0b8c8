"""The MLM loss alone, forward + backward, on (600, 30,522) logits (BERT-mini's masked rows in a 32 x 128
batch): F.cross_entropy on fp32 logits, the rows loss before (gradient computed in the backward, code at
d2c042c, copied here) and packing.cross_entropy now. 2 threads, mean of 10 calls, 3 interleaved rounds.

    PYTHONPATH=src python benchmarks/results/mlm-loss-2026-12-06/ce_micro.py
"""
import time

import torch
import torch.nn.functional as F

from bertkit.packing import CE_ROWS, cross_entropy


class Before(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets):
        lse = torch.empty(len(logits), dtype=torch.float32)
        for a in range(0, len(logits), CE_ROWS):
            lse[a:a + CE_ROWS] = torch.logsumexp(logits[a:a + CE_ROWS].float(), -1)
        ctx.save_for_backward(logits, targets, lse)
        return (lse - logits.gather(1, targets[:, None])[:, 0].float()).mean()

    @staticmethod
    def backward(ctx, g):
        logits, targets, lse = ctx.saved_tensors
        grad, scale = torch.empty_like(logits), g / len(logits)
        for a in range(0, len(logits), CE_ROWS):
            p = (logits[a:a + CE_ROWS].float() - lse[a:a + CE_ROWS, None]).exp_()
            p[torch.arange(len(p)), targets[a:a + CE_ROWS]] -= 1
            grad[a:a + CE_ROWS] = p.mul_(scale)
        return grad, None


if __name__ == "__main__":
    torch.set_num_threads(2)
    fns = {"F.cross_entropy(x.float())": lambda x, t: F.cross_entropy(x.float(), t),
           "rows, gradient in backward (before)": Before.apply, "rows, gradient in forward (now)": cross_entropy}
    for dt in (torch.bfloat16, torch.float32):
        torch.manual_seed(0)
        base, t = (torch.randn(600, 30522) * 3).to(dt), torch.randint(0, 30522, (600,))
        grads = {}
        for name, f in fns.items():
            x = base.clone().requires_grad_()
            f(x, t).backward()
            grads[name] = x.grad.float()
        ref = grads["F.cross_entropy(x.float())"]
        print(dt, "largest gradient difference to F.cross_entropy:",
              {k: f"{(g - ref).abs().max().item():.1e}" for k, g in grads.items()})
        ms = {k: [] for k in fns}
        for r in range(3):
            for name, f in fns.items():
                x = base.clone().requires_grad_()
                t0 = time.perf_counter()
                for _ in range(10):
                    f(x, t).backward()
                    x.grad = None
                ms[name].append((time.perf_counter() - t0) / 10 * 1e3)
        for name, v in ms.items():
            print(f"  {name:38s} " + " / ".join(f"{m:.1f}" for m in v) + " ms")
