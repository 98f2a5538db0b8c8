"""The zero-shot table of docs/REPRODUCTION.md: every measured CPU-grid arm against the base pre-trained
again on the Zen 4 (2026-12-05), from the files committed here and in ../ablate-cpu-2026-12-03/ and ../ablate-cpu-2026-12-06/.
Held-out MLM: paired on the same [MASK] positions, 95% interval clustered by sequence. BLiMP: paired on
the same 6,700 pairs where both per-pair outcome files exist, else the unpaired interval of two proportions."""
import json
import os

# run from the repository root with bertkit installed: python benchmarks/results/ablate-cpu-2026-12-05/zeroshot_table.py
from bertkit.ablate.measure import delta_cell, paired_mlm_difference
from bertkit.ablate.zeroshot import paired_difference, unpaired_difference
R3 = "benchmarks/results/ablate-cpu-2026-12-03"
R5 = "benchmarks/results/ablate-cpu-2026-12-05"
R6 = "benchmarks/results/ablate-cpu-2026-12-06"
def j(p): return json.load(open(p)) if os.path.exists(p) else None
def t(p): return open(p).read().strip() if os.path.exists(p) else None
arms = {  # name: (arm.json, mlm_outcomes, blimp_correct, label)
 "base": (f"{R5}/base_zen4/arm.json", f"{R5}/base_zen4/mlm_outcomes.json", f"{R5}/base_zen4/blimp_correct.txt", "base (MLM + NSP; Zen 4, 2026-12-05)"),
 "base_xeon": (f"{R3}/base_arm.json", f"{R3}/mlm_outcomes/base.json", None, "the same base, pre-trained on the Xeon (2026-12-03)"),
 "mlm_only": (f"{R3}/mlm_only_arm.json", f"{R3}/mlm_outcomes/mlm_only.json", None, "mlm_only (Xeon)"),
 "no_pretraining": (f"{R3}/no_pretraining_arm.json", f"{R3}/mlm_outcomes/no_pretraining.json", None, "no_pretraining"),
 "sop": (f"{R3}/sop_arm.json", f"{R3}/mlm_outcomes/sop.json", f"{R3}/sop_blimp_correct.txt", "sop (MLM + sentence order; Xeon)"),
 "mask_0_0_100": (f"{R3}/mask_0_0_100_final/arm.json", f"{R3}/mask_0_0_100_final/mlm_outcomes.json", None, "mask_0_0_100 (random tokens only; Xeon)"),
 "mask_100_0_0": (f"{R5}/mask_100_0_0/arm.json", f"{R5}/mask_100_0_0/mlm_outcomes.json", f"{R5}/mask_100_0_0/blimp_correct.txt", "mask_100_0_0 (always [MASK])"),
 "whole_word": (f"{R5}/whole_word/arm.json", f"{R5}/whole_word/mlm_outcomes.json", f"{R5}/whole_word/blimp_correct.txt", "whole_word (scored under token masking)"),
 "span": (f"{R5}/span/arm.json", f"{R5}/span/mlm_outcomes.json", f"{R5}/span/blimp_correct.txt", "span (SpanBERT spans, scored under token masking)"),
 "steps_half": (f"{R5}/steps_half/arm.json", f"{R5}/steps_half/mlm_outcomes.json", f"{R5}/steps_half/blimp_correct.txt", "steps_half (the base at 5,000 updates)"),
 "steps_quarter": (f"{R5}/steps_quarter/arm.json", f"{R5}/steps_quarter/mlm_outcomes.json", f"{R5}/steps_quarter/blimp_correct.txt", "steps_quarter (the base at 2,500 updates)"),
 "paper_arch_bert_init": (f"{R5}/paper_arch/arm.json", f"{R5}/paper_arch/mlm_outcomes.json", f"{R5}/paper_arch/blimp_correct.txt", "paper_arch_bert_init (post-LN, absolute positions, dropout 0.1; BERT's N(0, 0.02) start)"),
 "paper_arch": (f"{R5}/paper_arch_neighbours/arm.json", f"{R5}/paper_arch_neighbours/mlm_outcomes.json", f"{R5}/paper_arch_neighbours/blimp_correct.txt", "paper_arch (the same, heads started on their neighbours)"),
 "abs_pos": (f"{R5}/abs_pos/arm.json", f"{R5}/abs_pos/mlm_outcomes.json", f"{R5}/abs_pos/blimp_correct.txt", "abs_pos (plateau study: learned absolute positions alone)"),
 "dropout": (f"{R5}/dropout/arm.json", f"{R5}/dropout/mlm_outcomes.json", f"{R5}/dropout/blimp_correct.txt", "dropout (plateau study: dropout 0.1 alone)"),
 "size_h128": (f"{R5}/size_h128/arm.json", f"{R5}/size_h128/mlm_outcomes.json", f"{R5}/size_h128/blimp_correct.txt", "size_h128 (L4/H128, 1.9M parameters, lr 2e-3)"),
 "ltr_compute": (f"{R5}/ltr_compute/arm.json", None, f"{R5}/ltr_compute/blimp_correct.txt", "ltr_compute (left-to-right at the base's FLOPs)"),
 "ltr": (f"{R6}/ltr/arm.json", None, f"{R6}/ltr/blimp_correct.txt", "ltr (left-to-right at the base's tokens; Xeon AMX, 2026-12-06)"),
 "data_10pct": (f"{R6}/data_10pct/arm.json", f"{R6}/data_10pct/mlm_outcomes.json", f"{R6}/data_10pct/blimp_correct.txt", "data_10pct (a tenth of the text, ~100 passes; Xeon AMX, 2026-12-06)"),
 "mlm_only_amx": (f"{R6}/mlm_only/arm.json", f"{R6}/mlm_only/mlm_outcomes.json", f"{R6}/mlm_only/blimp_correct.txt", "mlm_only again (Xeon AMX, 2026-12-06)"),
 "sop_amx": (f"{R6}/sop/arm.json", f"{R6}/sop/mlm_outcomes.json", f"{R6}/sop/blimp_correct.txt", "sop again (Xeon AMX, 2026-12-06)"),
 "mask_0_0_100_amx": (f"{R6}/mask_0_0_100/arm.json", f"{R6}/mask_0_0_100/mlm_outcomes.json", f"{R6}/mask_0_0_100/blimp_correct.txt", "mask_0_0_100 again (Xeon AMX, 2026-12-06)"),
 "size_l8": (f"{R6}/size_l8/arm.json", f"{R6}/size_l8/mlm_outcomes.json", f"{R6}/size_l8/blimp_correct.txt", "size_l8 (L8/H256, 8.5M parameters, lr 1e-3; Xeon AMX, 2026-12-06)"),
}
def mlm_cell(arm: dict) -> str:
    """Held-out MLM at [MASK] / all targets; a left-to-right arm has no MLM head: its own next-token accuracy."""
    m = arm.get("mlm") or {}
    if m.get("accuracy_mask") is not None:
        return f"{m['accuracy_mask']:.3f} / {m['accuracy']:.3f}"
    own = (arm.get("pretrain") or {}).get("own_eval") or {}
    nt = own.get("eval_next_token_accuracy")
    return "n/a" if nt is None else f"n/a (next-token {nt:.3f})"


def blimp_cell(arm: dict) -> str:
    b = arm["blimp"]
    return f"{b['accuracy']:.3f} [{b['low']:.3f}, {b['high']:.3f}]" + ("" if b.get("method") == "pll" else " (log-likelihood)")


b_arm, b_o, b_b = j(arms["base"][0]), j(arms["base"][1]), t(arms["base"][2])
print("| arm | held-out MLM at [MASK] / all targets | Δ MLM at [MASK] vs base [95%] | BLiMP [95%] | Δ BLiMP vs base [95%] |")
print("|---|---:|---:|---:|---:|")
for name, (a, o, bc, label) in arms.items():
    A, O, B = j(a), j(o) if o else None, t(bc) if bc else None
    if A is None:                                   # not committed yet
        continue
    if name == "base":
        print(f"| {label} | {mlm_cell(A)} | base | {blimp_cell(A)} | base |")
        continue
    dm = delta_cell(paired_mlm_difference(O, b_o)) if O else "n/a"
    db = delta_cell(paired_difference(B, b_b)) if B else delta_cell(unpaired_difference(A["blimp"], b_arm["blimp"])) + " (unpaired)"
    print(f"| {label} | {mlm_cell(A)} | {dm} | {blimp_cell(A)} | {db} |")
