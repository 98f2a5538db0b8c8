"""The probe arms of `bertkit ablate`: `linear_probe.probe` on one task, its results kept under a key of
what changes their numbers, reused on a rerun, resumed at the probe an interrupted run was on."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..linear_probe import probe, probe_spec, write_results
from .config import _key, _read_json

if TYPE_CHECKING:
    from ..finetune.config import FinetuneConfig

log = logging.getLogger("bertkit")

RESULTS_VERSION = 3
"""What a probe's results.json holds: 2 = each probe's per-dev-example outcomes (`dev_outcomes`); 3 = C
chosen only among the values solved in every fold (`linear_probe.choose_c`), `cv_unconverged`. Part
of the probe arms' reuse key and of their plan (`ablate.arm.plan_key`): results of another version are redone."""

# FinetuneConfig keys that change a probe's numbers (the training options do not apply to it)
DATA_KEYS = ("task", "model", "data", "train_file", "dev_file", "text_column", "pair_column", "label_column",
             "id_column", "tokens_column", "tags_column", "format", "max_length", "stride", "windows",
             "train_limit", "dev_limit", "skip_bad_rows")


def probe_rows(arm, fcfg: "FinetuneConfig", pre: dict, weights: list, setting: str) -> list[dict]:
    """An ablate probe arm (`probe:` keys, `ProbeSpec`) on one task: one row per features x pooling.

    Results are kept in fcfg.out (results.json, with each probe's per-dev-example outcomes that the
    report pairs across arms; fits.jsonl) and reused while the data options, the spec, the model's
    weights (`weights`, ablate's weights_id) and `RESULTS_VERSION` are unchanged. An interrupted
    run resumes at the probe it was on (finished.jsonl, under the same key; gone once results.json is
    written). Row keys: arm,
    setting, task, seed (0: nothing is random), metric, value and best (the dev score of the main
    metric), dev (every dev metric), majority (the dev score of always answering the training
    majority class), probe ('lbfgs'), probe_features, probe_pooling (None for tagging), variant
    ('features/pooling', what tells one row of an arm from another), C (chosen), cv ({C: mean
    cross-validation score}), iterations, converged, grad_max, frozen (True), init, finetune_wall_s
    (cross-validation and refit of this row), encode_wall_s and finetune_cpu_s (the task's whole probe
    run), train_examples, dev_examples, pretrain_tokens, pretrain_updates, pretrain_wall_s, run_card
    (results.json) and status ('ok')."""
    out = Path(fcfg.out)
    spec = probe_spec(arm.probe, f"arm {arm.name} probe")
    key = _key({"given": {k: getattr(fcfg, k) for k in DATA_KEYS}, "spec": vars(spec), "weights": weights,
                "version": RESULTS_VERSION})                              # the reuse key of results.json
    result = _read_json(out / "results.json")
    if not (isinstance(result, dict) and result.get("ablate_key") == key):
        out.mkdir(parents=True, exist_ok=True)
        log.info("ablate: arm %s: probing %s (L-BFGS, %d features x poolings)", arm.name, fcfg.task,
                 len(spec.features) * len(spec.pooling))
        c0 = time.process_time()
        result = probe(fcfg, spec, fits_log=out / "fits.jsonl", finished=out / "finished.jsonl", key=key)
        result.update(cpu_s=round(time.process_time() - c0, 1), ablate_key=key)
        write_results(out / "results.json", result)
        (out / "finished.jsonl").unlink(missing_ok=True)
    return [{"arm": arm.name, "setting": setting, "task": fcfg.task, "seed": 0, "metric": p["metric"],
             "value": p["value"], "best": p["value"], "dev": p["dev"], "majority": result["majority"].get(p["metric"]),
             "probe": "lbfgs", "probe_features": p["features"], "probe_pooling": p["pooling"],
             "variant": p["features"] + (f"/{p['pooling']}" if p["pooling"] else ""), "C": p["C"], "cv": p["cv"],
             "iterations": p["iterations"], "converged": p["converged"], "grad_max": p["grad_max"], "frozen": True,
             "init": fcfg.init, "finetune_wall_s": p["fit_wall_s"], "encode_wall_s": result["encode_wall_s"],
             "finetune_cpu_s": result.get("cpu_s"), "train_examples": result["train_examples"],
             "dev_examples": result["dev_examples"], "pretrain_tokens": pre.get("tokens"),
             "pretrain_updates": pre.get("updates"), "pretrain_wall_s": pre.get("wall_s"),
             "run_card": str(out / "results.json"), "status": "ok"} for p in result["probes"]]

