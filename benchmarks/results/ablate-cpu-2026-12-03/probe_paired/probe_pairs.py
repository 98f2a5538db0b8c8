"""Paired probe differences (probe_base minus probe_random) from the arms' results.json, as the report computes them."""
import json, sys
from pathlib import Path
from bertkit.ablate.config import load_ablate_config
from bertkit.ablate.report import _probe_delta
cfg = load_ablate_config("configs/ablate/cpu.yaml")
print("| task | features / pooling | probe_base | probe_random | Δ base − random [95%] |")
print("|---|---|---:|---:|---:|")
cache = {}
for task in ("sst2", "mrpc"):
    res = {a: json.loads((Path(cfg.out) / "arms" / a / "probe" / task / "results.json").read_text()) for a in ("probe_base", "probe_random")}
    rnd = {(p["features"], p["pooling"]): p for p in res["probe_random"]["probes"]}
    for p in res["probe_base"]["probes"]:
        q = rnd[(p["features"], p["pooling"])]
        r = {"arm": "probe_base", "task": task, "probe_features": p["features"], "probe_pooling": p["pooling"]}
        key = "dev_f1" if task == "mrpc" else "dev_accuracy"
        val = lambda x: x.get("value", x.get("score", x.get(key)))
        print(f"| {task} | {p['features']} / {p['pooling']} | {val(p):.3f} | {val(q):.3f} | {_probe_delta(cfg, r, 'probe_random', cache)} |")
