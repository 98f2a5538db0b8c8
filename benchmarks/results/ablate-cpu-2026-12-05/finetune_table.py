"""Fine-tuning table of docs/REPRODUCTION.md from runs kept in several folders: each arm's seeds at the
learning rate it chose on dev, mean ± sd, and the difference from the base with Welch's 95% interval,
computed by the grid report's own `bertkit.ablate.report.summarize`. Reads the `results.jsonl` files
given as LABEL=FILE (one arm each; LABEL replaces the arm's name, so two runs of one arm can stand side
by side); the one labelled `base` is the reference.
Run from the repository root: python benchmarks/results/ablate-cpu-2026-12-05/finetune_table.py base=FILE LABEL=FILE..."""
import json
import sys
from types import SimpleNamespace

from bertkit.ablate.report import summarize

TASKS = [("sst2", "SST-2 accuracy"), ("mrpc", "MRPC F1"), ("conll2003", "CoNLL-2003 F1")]
labels, rows = [], []
for given in sys.argv[1:]:
    label, path = given.split("=", 1)
    labels.append(label)
    rows += [{**json.loads(line), "arm": label} for line in open(path)]
cells, _ = summarize(SimpleNamespace(base_arm="base"), rows)


def cell(c: dict | None) -> str:
    if not c:
        return "not run"
    collapsed = f", {c['collapsed']} collapsed" if c["collapsed"] else ""
    text = f"{c['mean']:.3f} ± {c['std']:.3f} ({c['lr']:g}; {c['n']} seeds{collapsed})"
    if c.get("ci"):
        text += f"; Δ {c['delta']:+.3f} [{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}]" + (" *" if c["beyond"] else "")
    return text


print("| arm | " + " | ".join(f"{t} (lr)" for _, t in TASKS) + " |")
print("|---|" + "---:|" * len(TASKS))
for label in labels:
    print(f"| {label} | " + " | ".join(cell(cells.get((label, task))) for task, _ in TASKS) + " |")
