"""`bertkit probe`: how much of a task a linear map reads off a frozen checkpoint's states.

    bertkit probe --model DIR --task sst2 --data glue/SST-2 --train-limit 2000
    bertkit probe --model DIR --task conll2003 --data conll2003 --features last,concat_last_four

A thin layer over `bertkit.linear_probe.probe` (logistic regression by L-BFGS, C by cross-validation).
"""
from __future__ import annotations

import logging
from pathlib import Path

from ..errors import BertkitError

log = logging.getLogger("bertkit")


def setup_probe(p) -> None:
    from ..cliconfig import checked
    from ..runconfig import AT_LEAST_1, POSITIVE, THREADS
    from ..linear_probe import GRID_C, TABLE7

    p.epilog = ("Each feature (x pooling, sentence tasks) is a logistic regression on the standardised frozen "
                "states, fitted by L-BFGS to convergence; C is chosen by k-fold cross-validation on the training "
                "data only, then the dev set is scored with the task's own metric beside the majority class's.")
    p.add_argument("--model", required=True, metavar="DIR", help="checkpoint folder (bertkit or Hugging Face BERT) "
                   "with its tokenizer")
    p.add_argument("--task", required=True, help="a classification or tagging task: sst2, mrpc, cola, qqp, mnli, "
                   "qnli, rte, wnli, conll2003")
    p.add_argument("--data", metavar="DIR", help="the task's folder (train + dev files as distributed)")
    p.add_argument("--train-file", dest="train_file", metavar="FILE", help="training file (instead of --data)")
    p.add_argument("--dev-file", dest="dev_file", metavar="FILE", help="dev file (instead of --data)")
    p.add_argument("--features", default=",".join(TABLE7),
                   help=f"comma-separated feature choices (default: {','.join(TABLE7)}; also sum_all, "
                        "concat_last_N, sum_last_N; sums are plain sums)")
    p.add_argument("--pooling", default=None, help="sentence tasks: cls, mean, last, comma-separated "
                   "(default: cls,mean; last,mean on a causal model); tagging reads each word's first piece")
    p.add_argument("--C", dest="C", default=",".join(f"{c:g}" for c in GRID_C),
                   help="inverse L2 strengths to choose from by cross-validation (default: %(default)s)")
    p.add_argument("--folds", type=checked(int, AT_LEAST_1), default=5, help="cross-validation folds, 2 or more (default 5)")
    p.add_argument("--tol", type=checked(float, POSITIVE), default=1e-6,
                   help="converged when the largest gradient entry is at most this (default 1e-6)")
    p.add_argument("--max-iter", dest="max_iter", type=checked(int, AT_LEAST_1), default=1000,
                   help="L-BFGS iterations at most per fit (default 1000; the count is reported)")
    p.add_argument("--train-limit", dest="train_limit", type=checked(int, AT_LEAST_1), default=None, metavar="N",
                   help="only the first N training examples")
    p.add_argument("--dev-limit", dest="dev_limit", type=checked(int, AT_LEAST_1), default=None, metavar="N",
                   help="only the first N dev examples")
    p.add_argument("--max-length", dest="max_length", type=checked(int, AT_LEAST_1), default=None,
                   help="tokens per input window (default: the task's, within the model's positions)")
    p.add_argument("--out", metavar="DIR", help="folder for results.json and fits.jsonl (default runs/probe-TASK)")
    p.add_argument("--json", action="store_true", help="print the results JSON instead of the table")
    p.add_argument("--threads", type=checked(int, THREADS), default=0, help="CPU threads (0: torch's default)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1 ...")
    p.set_defaults(run=run_probe)


def run_probe(args) -> int:
    from ..finetune_config import FinetuneConfig
    from ..tasks.plumbing import CUSTOM
    from ..linear_probe import ProbeSpec, probe, results_json, write_results
    from .basic import check_device

    check_device(args.device)
    if args.task in CUSTOM or args.task == "embedding":
        raise BertkitError(f"--task {args.task}: bertkit probe takes a task from the table (sst2, mrpc, conll2003, ...)")
    if not Path(args.model).is_dir():
        raise BertkitError(f"--model {args.model}: no such folder")
    if args.data is None and args.train_file is None:
        raise BertkitError("give --data DIR (or --train-file and --dev-file)")
    out = Path(args.out or f"runs/probe-{args.task}")
    if out.exists() and not out.is_dir():
        raise BertkitError(f"--out {out}: exists and is not a folder")
    spec = ProbeSpec(features=_listed(args.features, "--features"),
                     pooling=_listed(args.pooling, "--pooling") if args.pooling else _default_pooling(args.model),
                     C=_listed(args.C, "--C"), folds=args.folds,
                     tol=args.tol, max_iter=args.max_iter)
    cfg = FinetuneConfig(task=args.task, model=args.model, data=args.data, train_file=args.train_file,
                         dev_file=args.dev_file, train_limit=args.train_limit, dev_limit=args.dev_limit,
                         max_length=args.max_length, threads=args.threads, device=args.device, progress=False,
                         out=str(out))
    result = probe(cfg, spec, progress=True, fits_log=_fits_path(out))
    write_results(out / "results.json", result)
    log.info("probe: encoded in %.1f s, %.1f s in all (%d threads, %s)", result["encode_wall_s"], result["wall_s"],
             result["threads"], result["device"])
    if args.json:
        print(results_json(result))
    else:
        print(table(result))
        print(f"wrote {out / 'results.json'} and {out / 'fits.jsonl'}")
    return 0


def _listed(text: str, option: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise BertkitError(f"{option}: give one or more values, comma-separated")
    return items


def _default_pooling(model: str) -> list[str]:
    from ..checkpoint import read_config

    return ["last", "mean"] if read_config(Path(model))[0].causal else ["cls", "mean"]


def _fits_path(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    return out / "fits.jsonl"


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
