"""paper_arch's three changes one at a time, and the three with the heads started on their neighbours: each arm's training MLM loss (mean over the 50-update log
window) and its own held-out accuracy at [MASK] (256 held-out sequences, the same for every arm),
at the updates every listed arm has reached. Reads ARM/metrics.jsonl and ARM/eval.jsonl beside this file.
Run from the repository root: python benchmarks/results/ablate-cpu-2026-12-05/decompose/curves_table.py"""
import json
from pathlib import Path

here = Path(__file__).resolve().parent
ARMS = {"base": "base (pre-LN, ALiBi, no dropout, lr 1e-3)", "post_ln": "post-LN alone (lr 5e-4)",
        "dropout": "dropout 0.1 alone", "abs_pos": "learned absolute positions alone",
        "paper_arch": "all three (the paper's architecture, lr 5e-4)",
        "paper_arch_neighbours": "all three, heads started on their neighbours (the grid's paper_arch now)"}


def rows(arm, name):
    path = here / arm / name
    return {r["step"]: r for r in map(json.loads, path.read_text().splitlines())} if path.is_file() else {}


train = {a: rows(a, "metrics.jsonl") for a in ARMS}
held = {a: rows(a, "eval.jsonl") for a in ARMS}
steps = [s for s in (250, 500, 1000, 1500, 2000, 2500, 3000, 4000, 5000, 7500, 10000) if train["base"].get(s)]
print("Training MLM loss (accuracy over all targets), by update:\n")
print("| arm | " + " | ".join(f"{s:,}" for s in steps) + " |")
print("|---|" + "---:|" * len(steps))
for a, label in ARMS.items():
    cells = [f"{train[a][s]['mlm_loss']:.2f} ({train[a][s]['mlm_accuracy']:.3f})" if s in train[a] else "—" for s in steps]
    print(f"| {label} | " + " | ".join(cells) + " |")
# the evaluations every 2,500 updates, and post_ln's where it was paused (a resumed run also evaluates where it resumed)
evals = sorted({s for a in ARMS for s in held[a] if s and (s % 2500 == 0 or a == "post_ln")})
print("\nHeld-out accuracy at [MASK] (the run's own evaluation), by update:\n")
print("| arm | " + " | ".join(f"{s:,}" for s in evals) + " |")
print("|---|" + "---:|" * len(evals))
for a, label in ARMS.items():
    print(f"| {label} | " + " | ".join(f"{held[a][s]['eval_mask_accuracy']:.3f}" if s in held[a] else "—"
                                       for s in evals) + " |")
print("\nThe unigram guess (always `the`) scores 0.052 at [MASK].")
