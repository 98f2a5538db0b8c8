"""A/B of bertkit's BERT-mini pre-training step (padded path, bf16 autocast, as pretrain_vs_hf.py times it)
in one process: arm 'old' = the MLM loss and the CPU dropout as at 0c3aa66 (logits cut to the M masked rows,
whose backward zero-fills an (m, V) gradient; the loss from exp/sum a few rows at a time; the dropout mask a
bool cast to x's dtype, two multiplies each way), arm 'new' = the working tree's.
Interleaved rounds of 2 steps each; medians (`alternate`, which the other A/B scripts here import through
runpy). Usage: python step_ab.py OLD_PACKING_PY [rounds] [fp32]"""
import importlib.util, statistics, sys, tempfile, time
from pathlib import Path
import torch
sys.path.insert(0, "benchmarks")
import pretrain_vs_hf as pv
import bertkit.model as bm
import bertkit.packing as bp
from bertkit.heap import Heap
Heap().keep_freed()
torch.set_num_threads(2)
spec = importlib.util.spec_from_file_location("old_packing", sys.argv[1])
old = importlib.util.module_from_spec(spec); sys.modules["old_packing"] = old; spec.loader.exec_module(old)
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 15
dtype = torch.float32 if "fp32" in sys.argv[3:] else torch.bfloat16
tmp = Path(tempfile.mkdtemp())
batches = pv.make_batches(2, 32, 128, tmp)
ours, hf, cfg = pv.build_pair("mini", tmp)
from bertkit.hardware import attention_kernel
from bertkit.model import set_attention_kernel
set_attention_kernel(ours, attention_kernel(torch.device("cpu"), dtype, cfg, 128)[0])
opt = torch.optim.AdamW(ours.parameters(), lr=1e-4, fused=True)
new_forward = bm.BertForPreTraining.forward
def old_forward(self, input_ids, token_type_ids=None, attention_mask=None, mlm_labels=None, nsp_labels=None,
                packed=None, position_ids=None):
    h = self.bert(input_ids, token_type_ids, attention_mask, position_ids, packed)
    out = self.outputs(h, packed, attention_mask, mlm_labels)
    if mlm_labels is not None:
        out["mlm_loss"] = old.cross_entropy(out["mlm_logits"], out["mlm_targets"])
    if "nsp_logits" in out and nsp_labels is not None:
        out["nsp_loss"] = torch.nn.functional.cross_entropy(out["nsp_logits"].float(), nsp_labels)
    out["loss"] = out["mlm_loss"] + out.get("nsp_loss", 0.0)
    return out
arms = {"old": (old_forward, old.dropout), "new": (new_forward, bp.dropout)}
step = pv.step_fn("padded", ours, opt, dtype)


def alternate(variants: dict, use, rounds: int) -> dict:
    """Median seconds a step of each variant: use(variant) swaps it in; one warm-up pass each, then
    `rounds` rounds over `batches`, the order reversed every other round."""
    for v in variants.values():
        use(v)
        for b in batches: step(b)
    times = {k: [] for k in variants}
    for r in range(rounds):
        for name in (list(variants) if r % 2 == 0 else list(reversed(variants))):
            use(variants[name])
            t0 = time.perf_counter()
            for b in batches: step(b)
            times[name].append(time.perf_counter() - t0)
    for k, v in times.items():
        print(f"{k}: median {statistics.median(v) / len(batches) * 1e3:.1f} ms a step, "
              f"fastest {min(v) / len(batches) * 1e3:.1f}")
    return {k: statistics.median(v) for k, v in times.items()}


def use_arm(arm):
    bm.BertForPreTraining.forward, bp.dropout = arm


if __name__ == "__main__":
    med = alternate(arms, use_arm, rounds)
    print(f"{dtype}: new/old step time: {med['new'] / med['old']:.3f}")
