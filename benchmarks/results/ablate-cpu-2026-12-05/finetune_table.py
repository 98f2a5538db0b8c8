"""Fine-tuning table of docs/REPRODUCTION.md: each arm's 5 seeds per task at the learning rate it chose on
dev (the rows with status "ok": seeds 0-4 at the chosen rate), mean ± sd, and Welch's 95% interval of the difference
from the base (`bertkit.ablate.report.difference_ci`, the grid report's own). Reads the `results.jsonl`
files given as LABEL=FILE (one arm each); the one labelled `base` is the reference.
Run from the repository root: python benchmarks/results/ablate-cpu-2026-12-05/finetune_table.py base=FILE LABEL=FILE..."""
import json, sys
from collections import defaultdict

from bertkit.ablate.report import difference_ci, mean_std

TASKS = [("sst2", "SST-2 accuracy"), ("mrpc", "MRPC F1"), ("conll2003", "CoNLL-2003 F1")]
runs = defaultdict(lambda: defaultdict(list))            # arm -> task -> [(value, lr, collapsed)]
order = []
for given in sys.argv[1:]:
    label, path = given.split("=", 1)
    order.append(label)
    for line in open(path):
        r = json.loads(line)
        if r.get("status") == "ok":
            runs[label][r["task"]].append((r["value"], r["lr"], bool(r.get("collapsed"))))
base = runs["base"]
print("| arm | " + " | ".join(f"{t} (lr)" for _, t in TASKS) + " |")
print("|---|" + "---:|" * len(TASKS))
for arm in order:
    cells = []
    for task, _ in TASKS:
        v = runs[arm].get(task, [])
        if not v:
            cells.append("not run"); continue
        m, s = mean_std([x for x, _, _ in v])
        cell = f"{m:.3f} ± {s:.3f} ({v[0][1]:g}; {len(v)} seeds" + (f", {sum(c for *_, c in v)} collapsed" if any(c for *_, c in v) else "") + ")"
        if arm != "base" and base.get(task):
            ci = difference_ci([x for x, _, _ in v], [x for x, _, _ in base[task]])
            if ci:
                d = m - mean_std([x for x, _, _ in base[task]])[0]
                cell += f"; Δ {d:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]" + (" *" if ci[0] > 0 or ci[1] < 0 else "")
        cells.append(cell)
    print(f"| {arm} | " + " | ".join(cells) + " |")
