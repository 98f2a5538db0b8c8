"""`bertkit probe`: how much of a task a linear map reads off a frozen checkpoint's states.

    bertkit probe --model DIR --task sst2 --data glue/SST-2 --train-limit 2000
    bertkit probe --model DIR --task conll2003 --data conll2003 --features last,concat_last_four

A thin layer over `bertkit.linear_probe.probe` (logistic regression by L-BFGS, C by cross-validation).
"""
from __future__ import annotations

import logging
from pathlib import Path

from ..checkpoint import read_config
from ..cliconfig import add_options, given
from ..errors import BertkitError
from ..finetune.config import FinetuneConfig
from ..linear_probe import ProbeSpec, probe, results_json, write_results
from ..tasks.plumbing import CUSTOM
from .basic import Args, check_device

log = logging.getLogger("bertkit")


# FinetuneConfig fields that are probe's options too: the data, its limits, where the results go, where it runs
RUN_OPTIONS = ("data", "train_file", "dev_file", "train_limit", "dev_limit", "max_length", "out", "threads", "device")


def setup_probe(p) -> None:
    """--model, --task, --json; one flag per ProbeSpec field and per RUN_OPTIONS field (`bertkit.cliconfig`)."""
    p.epilog = ("Each feature (x pooling, sentence tasks) is a logistic regression on the standardised frozen "
                "states, fitted by L-BFGS to convergence; C is chosen by k-fold cross-validation on the training "
                "data only, then the dev set is scored with the task's own metric beside the majority class's.")
    add_options(p, Args, names=("model", "task", "json"), defaults=True, required=("task",), help={
        "task": "a classification or tagging task: sst2, mrpc, cola, qqp, mnli, qnli, rte, wnli, conll2003"})
    add_options(p, FinetuneConfig, names=RUN_OPTIONS, help={
        "dev_file": "Dev file (instead of --data).", "device": "cpu (default), cuda, cuda:1 ...",
        "out": "Folder for results.json and fits.jsonl (default runs/probe-TASK)."})
    add_options(p, ProbeSpec)
    p.set_defaults(run=run_probe, device="cpu")


def run_probe(args) -> int:
    check_device(args.device)
    if args.task in CUSTOM or args.task == "embedding":
        raise BertkitError(f"--task {args.task}: bertkit probe takes a task from the table (sst2, mrpc, conll2003, ...)")
    if not Path(args.model).is_dir():
        raise BertkitError(f"--model {args.model}: no such folder")
    values = {k: v for k, v in given(args, FinetuneConfig).items() if k in ("task", "model", *RUN_OPTIONS)}
    if values.get("data") is None and values.get("train_file") is None:
        raise BertkitError("give --data DIR (or --train-file and --dev-file)")
    out = Path(values.setdefault("out", f"runs/probe-{args.task}"))
    if out.exists() and not out.is_dir():
        raise BertkitError(f"--out {out}: exists and is not a folder")
    choices = given(args, ProbeSpec)
    if "pooling" not in choices:
        choices["pooling"] = ["last", "mean"] if read_config(Path(args.model))[0].causal else ["cls", "mean"]
    spec, cfg = ProbeSpec(**choices), FinetuneConfig(**values, progress=False)
    out.mkdir(parents=True, exist_ok=True)
    result = probe(cfg, spec, progress=True, fits_log=out / "fits.jsonl")
    write_results(out / "results.json", result)
    log.info("probe: encoded in %.1f s, %.1f s in all (%d threads, %s)", result["encode_wall_s"], result["wall_s"],
             result["threads"], result["device"])
    if args.json:
        print(results_json(result))
    else:
        print(table(result))
        print(f"wrote {out / 'results.json'} and {out / 'fits.jsonl'}")
    return 0


def table(result: dict) -> str:
    """The results as a text table: one line per features x pooling, the majority class first (no
    timings: they are in results.json and the log)."""
    metric, maj = result["metric"], result["majority"]
    extra = [k for k in ("accuracy", "f1") if k != metric and k in maj]
    lines = [f"probe {result['task']}: {result['train_examples']:,} training / {result['dev_examples']:,} dev "
             f"examples ({result['train_rows']:,} / {result['dev_rows']:,} rows), C by {result['spec']['folds']}-fold "
             f"cross-validation", f"majority class {maj['label']!r}: dev {metric} {maj[metric]:.4f}"
             + "".join(f", {k} {maj[k]:.4f}" for k in extra)]
    head = ["features", "pooling", f"dev {metric}", *(f"dev {k}" for k in extra), "C", f"CV {metric}",
            "iterations", "converged"]
    rows = [[p["features"], p["pooling"] or "word", f"{p['value']:.4f}", *(f"{p['dev'][k]:.4f}" for k in extra),
             f"{p['C']:g}", f"{p['cv'][format(p['C'], 'g')]:.4f}", str(p["iterations"]),
             "yes" if p["converged"] else "NO"] for p in result["probes"]]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines += ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
              for r in [head, *rows]]
    lines += [f"left out: {s}" for s in result["skipped"]]
    return "\n".join(lines)
