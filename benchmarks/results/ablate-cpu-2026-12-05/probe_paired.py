"""Frozen-feature probes of two models paired on the same dev examples: per feature and pooling, each
model's dev score and the difference with its 95% interval (`bertkit.ablate.measure.paired_ratio_difference`,
the grid report's own: ratios of per-example sums, each example a cluster).
Run from the repository root: python benchmarks/results/ablate-cpu-2026-12-05/probe_paired.py A.json B.json"""
import json, sys

from bertkit.ablate.measure import delta_cell, paired_ratio_difference

a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["dev_ids"] == b["dev_ids"], "not the same dev examples"
key = lambda r: (r["features"], r["pooling"])
other = {key(r): r for r in b["probes"]}
print(f"{a['task']} ({a['metric']}; majority {a['majority'][a['metric']]:.3f}): A = {sys.argv[1]}, B = {sys.argv[2]}")
print("| features | pooling | A | B | A - B [95%] |")
print("|---|---|---:|---:|---:|")
for r in a["probes"]:
    s = other.get(key(r))
    if not s or "outcomes" not in r or "outcomes" not in s:
        continue
    d = paired_ratio_difference(r["outcomes"]["num"], r["outcomes"]["den"], s["outcomes"]["num"], s["outcomes"]["den"])
    cell = delta_cell(d)
    print(f"| {r['features']} | {r['pooling'] or '-'} | {r['value']:.3f}{'' if r.get('converged', True) else ' (not converged)'} | "
          f"{s['value']:.3f}{'' if s.get('converged', True) else ' (not converged)'} | {cell} |")
