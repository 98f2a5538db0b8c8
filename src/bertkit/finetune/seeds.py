"""`bertkit finetune --seeds 0,1,2,3,4`: one recipe fine-tuned under several seeds, and its spread.

Fine-tuning BERT on small data moves with the seed (the head's initialisation, the data order and
dropout all follow it): the paper restarted small GLUE tasks and kept the best on dev, and runs that
predict one class for everything are common enough to count. So the command trains every seed,
reports each dev metric's mean, sample standard deviation (n - 1) and min-max with the seeds that
collapsed, and keeps the best seed on dev as the model. The folder:

    OUT/seed-N/        one complete fine-tuning output per seed (written as seed-N.incomplete and
                       swapped in when done, `bertkit.outdir`): a rerun skips a finished seed (after
                       checking it was trained with the same settings) and restarts an interrupted one
    OUT/seeds.jsonl    one line per seed as it is trained or found finished (dev metrics, collapse)
    OUT/seeds.json     the summary: per-metric statistics, collapsed seeds, the chosen seed and why
    OUT/config.json, model.safetensors, tokenizer, metrics, ...: the chosen seed's files (hard links,
                       copies where the file system has none), so OUT loads in evaluate / predict /
                       serve as one fine-tuning run does; run_card.{md,json} gain the seeds' summary

The chosen seed is the best on the same dev file its score is reported on, so that score is
optimistic: the mean is the recipe's figure. Collapse is judged on each seed's kept checkpoint
(`collapse_rule`): every dev prediction one class (classification, multiple choice), one number
(regression), no entity (tagging), "no answer" to every question (SQuAD v2.0); SQuAD v1.1 has no
collapse to count (each answer is a span of its own context).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Mapping, Sequence

import yaml
from tqdm.auto import tqdm

from ..errors import BertkitError, DataError
from ..outdir import INCOMPLETE_KEY, _check_out, write_whole
from ..runconfig import SEED, to_dict
from ..sources import read_jsonl

log = logging.getLogger("bertkit")

SUMMARY, LOG = "seeds.json", "seeds.jsonl"
IGNORED = ("out", "seed", "progress", "threads", "log_every", "eval_batch_size", "device")
"""FinetuneConfig fields a finished seed may differ in and still be this run's (how it ran, not what)."""


def parse_seeds(text: str) -> list[int]:
    """'0,1,2,3,4' -> [0, 1, 2, 3, 4]: integers in [0, 2**32 - 1], each once; else one error line."""
    parts = [p.strip() for p in str(text).split(",")]
    if not any(parts):
        return check_seeds([])                      # the error: no seeds
    seeds = []
    for p in parts:
        try:
            seeds.append(int(p))
        except ValueError:
            raise BertkitError(f"--seeds: {p!r} is not an integer (write them comma-separated, e.g. 0,1,2)") from None
    return check_seeds(seeds)


def check_seeds(seeds: Sequence[int]) -> list[int]:
    """The seeds as a list, each a valid seed and given once; else one error line."""
    if not seeds:
        raise BertkitError("--seeds: no seeds given; write them comma-separated, e.g. --seeds 0,1,2,3,4")
    for i, seed in enumerate(seeds):
        if problem := SEED.problem(seed):
            raise BertkitError(f"--seeds: each seed {problem}")
        if seed in seeds[:i]:
            raise BertkitError(f"--seeds: seed {seed} is given twice")
    return list(seeds)


def is_seeds_output(path: Path) -> bool:
    """Whether a folder holds (part of) a previous `--seeds` run."""
    return (path / LOG).is_file() or (path / SUMMARY).is_file() or any(path.glob("seed-*/finetune.yaml"))


def finetune_seeds(cfg, seeds: Sequence[int], command: str = "") -> dict:
    """Fine-tune `cfg` once per seed into cfg.out/seed-N, keep the best on dev as cfg.out's model;
    returns the summary (also cfg.out/seeds.json)."""
    from . import columns_of, finetune, is_finetune_output, task_max_length
    from ..tasks.plumbing import resolve_task

    if cfg.task == "embedding":
        raise BertkitError("--seeds: task embedding is not supported; run each --seed into its own --out")
    seeds = check_seeds(list(seeds))
    task = resolve_task(cfg.task, columns_of(cfg))
    check_dev(task, cfg)
    cfg = dataclasses.replace(cfg, max_length=task_max_length(task, cfg))   # as finished seeds record it
    out = Path(os.path.abspath(cfg.out))
    _check_out(out, lambda p: is_finetune_output(p) or is_seeds_output(p), "fine-tuning run")
    finished = {s: finished_seed(out / f"seed-{s}", seed_config(cfg, s, out)) for s in seeds}   # all checked first
    t0 = time.time()
    runs = []
    bar = tqdm(seeds, desc=f"seeds {task.name}", disable=not cfg.progress, dynamic_ncols=True)
    for seed in bar:
        folder = out / f"seed-{seed}"
        if finished[seed] is not None:
            log.info("seed %d: finished in %s, skipped", seed, folder)
            result = finished[seed]
        else:
            log.info("seed %d (%d of %d) into %s", seed, seeds.index(seed) + 1, len(seeds), folder)
            result = finetune(seed_config(cfg, seed, out), command=f"{command}  # seed {seed}")
        run = {"seed": seed, "folder": folder.name, "skipped": finished[seed] is not None,
               "best_step": result["best_step"], "wall_time_s": result["wall_time_s"],
               "dev": {k: v for k, v in (result["dev"] or {}).items() if is_number(v)},
               "collapsed": collapsed(task, folder / "dev_predictions.jsonl")}
        runs.append(run)
        with open(out / LOG, "a", encoding="utf-8") as f:
            f.write(json.dumps({**run, "time": round(time.time(), 1)}) + "\n")
        main = run["dev"].get(task.main_metric)
        bar.set_postfix({task.main_metric: f"{main:.4f}" if is_number(main) else main})
    bar.close()
    summary = summarize(task, runs, result.get("dev_file"), time.time() - t0)
    promote(out, out / f"seed-{summary['chosen_seed']}", summary)
    log.info("%d seeds: %s mean %s; seed %d chosen on dev; model in %s", len(seeds), task.main_metric,
             _num(summary["metrics"][task.main_metric]["mean"]), summary["chosen_seed"], out)
    return summary


def seed_config(cfg, seed: int, out: Path):
    return dataclasses.replace(cfg, seed=seed, out=str(out / f"seed-{seed}"))


def check_dev(task, cfg) -> None:
    """The best seed is chosen on dev: a run without a dev file is refused before any training."""
    if cfg.dev_file is not None:
        return
    if cfg.data is None:
        raise BertkitError("--seeds chooses the best seed on dev: give --dev-file (or --data with a dev split)")
    try:
        task.split_path(cfg.data, "dev")
    except DataError as e:
        raise BertkitError(f"--seeds chooses the best seed on dev, and there is none: {e}") from None


def finished_seed(folder: Path, cfg) -> dict | None:
    """A finished seed's metrics.json (None when it is not finished); an error when it was trained
    with other settings than `cfg` (fields in IGNORED aside)."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        result = json.loads((folder / "metrics.json").read_text(encoding="utf-8"))
        saved = yaml.safe_load((folder / "finetune.yaml").read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return None
    if INCOMPLETE_KEY in config or not isinstance(saved, dict):
        return None
    wanted = to_dict(cfg)
    differ = [k for k, v in wanted.items() if k not in IGNORED and saved.get(k) != v]
    if differ or saved.get("seed") != cfg.seed:
        k = differ[0] if differ else "seed"
        raise BertkitError(f"{folder}: a finished seed fine-tuned with {k} {saved.get(k)!r}, this run asks "
                           f"{wanted[k]!r}: give a new --out, or delete {folder} to train it again")
    return result


# ---- collapse -----------------------------------------------------------------------------------
def collapse_rule(task) -> tuple[str | None, str]:
    """(what a collapsed seed is on this task, None where nothing is counted; why)."""
    if task.head == "sequence_classification":
        if task.problem == "regression":
            return "every dev prediction the same number (within 0.1%)", "a constant regressor"
        return "every dev prediction one class", "the majority-class answer"
    if task.head == "token_classification":
        return "no entity predicted on dev (every tag O, or one tag everywhere)", "a tagger that marks nothing"
    if task.head == "multiple_choice":
        return "every dev prediction the same ending", "one choice for every question"
    if task.name == "squad2":
        return "every dev question answered 'no answer'", "the null answer everywhere"
    return None, ("not counted: SQuAD v1.1 answers with a span of each question's own context, so no single "
                  "answer to collapse to; a run that learned nothing shows as F1 near 0 in the spread")


def collapsed(task, predictions: Path) -> bool | None:
    """Whether a seed's kept checkpoint collapsed (`collapse_rule`), from its dev_predictions.jsonl;
    None where the task has no rule or there are no predictions."""
    rule, _ = collapse_rule(task)
    if rule is None or not predictions.is_file():
        return None
    return is_collapsed(task, [obj["prediction"] for obj in read_jsonl(predictions)])


def is_collapsed(task, values: list) -> bool | None:
    """Whether dev predictions (`values`: one per example; a list of tags per sentence for tagging)
    collapsed by `collapse_rule`; None for no predictions."""
    if not values:
        return None
    if task.head == "question_answering":
        return all(v == "" for v in values)
    if task.head == "sequence_classification" and task.problem == "regression":
        nums = [float(v) for v in values]
        mean = statistics.fmean(nums)
        return max(nums) - min(nums) <= 1e-3 * max(1.0, abs(mean))
    if task.head == "token_classification":
        values = [tag for tags in values for tag in tags]
    return one_answer(Counter(json.dumps(v) for v in values))


def one_answer(counts: Mapping[str, int]) -> bool:
    """The collapse of a classifier, a tagger (every tag O, or one tag everywhere) or a multiple-choice
    model: at most one answer predicted, from how often each was (`finetune.predicted_counts`)."""
    return sum(1 for n in counts.values() if n) <= 1


# ---- the summary --------------------------------------------------------------------------------
def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def statistics_of(values: Sequence[float]) -> dict:
    """mean, sample standard deviation (n - 1; None for one value), min, max over the finite values."""
    finite = [float(v) for v in values if is_number(v) and math.isfinite(v)]
    if not finite:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
    return {"mean": statistics.fmean(finite), "std": statistics.stdev(finite) if len(finite) > 1 else None,
            "min": min(finite), "max": max(finite), "n": len(finite)}


def summarize(task, runs: list[dict], dev_file: str | None, wall_time_s: float) -> dict:
    """seeds.json: per-metric statistics, collapsed seeds, the chosen seed (best main metric on dev,
    the first of equal scores; a score that is not a finite number never wins)."""
    main = task.main_metric
    names = list(dict.fromkeys(k for r in runs for k in r["dev"]))

    def score(r):
        v = r["dev"].get(main)
        return v if is_number(v) and math.isfinite(v) else -math.inf
    best = max(runs, key=score)          # max keeps the first of equal scores
    rule, why = collapse_rule(task)
    return {"task": task.name, "main_metric": main, "seeds": [r["seed"] for r in runs], "dev_file": dev_file,
            "chosen_seed": best["seed"], "chosen_dev": best["dev"],
            "chosen_by": f"the best dev {main} of the {len(runs)} seeds (the first of equal scores); picked on "
                         f"that dev file, so its dev score is optimistic: the mean is the recipe's figure",
            "metrics": {k: statistics_of([r["dev"].get(k) for r in runs]) for k in names},
            "collapse": {"rule": rule, "why": why,
                         "seeds": [r["seed"] for r in runs if r["collapsed"]] if rule else None},
            "runs": runs, "wall_time_s": round(wall_time_s, 1),
            "seed_time_s": round(sum(r["wall_time_s"] or 0 for r in runs), 1)}


def promote(out: Path, chosen: Path, summary: dict) -> None:
    """Make `out` the chosen seed's model: its files linked in, seeds.json, the run card with the
    summary, and config.json last (removed first), so OUT is no checkpoint while its files change."""
    from .card import seeds_card_lines

    (out / "config.json").unlink(missing_ok=True)
    for p in out.iterdir():                        # a previous run's files (the previous chosen seed's)
        if p.is_file() and p.name != LOG:
            p.unlink()
    for item in chosen.iterdir():
        if item.is_file() and item.name not in ("config.json", "run_card.json", "run_card.md"):
            try:
                os.link(item, out / item.name)
            except OSError:
                shutil.copy2(item, out / item.name)
    (out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    card = json.loads((chosen / "run_card.json").read_text(encoding="utf-8"))
    card["seeds"] = {k: v for k, v in summary.items() if k != "runs"}
    (out / "run_card.json").write_text(json.dumps(card, indent=2, default=str) + "\n", encoding="utf-8")
    md = (chosen / "run_card.md").read_text(encoding="utf-8").rstrip("\n")
    (out / "run_card.md").write_text(md + "\n\n" + "\n".join(seeds_card_lines(summary)) + "\n", encoding="utf-8")
    write_whole(out / "config.json", (chosen / "config.json").read_text(encoding="utf-8"))


# ---- what the commands print --------------------------------------------------------------------
def _num(v) -> str:
    return "-" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v)


def summary_lines(summary: dict, out: str) -> list[str]:
    """The table `bertkit finetune --seeds` prints: one row per dev metric, then the chosen seed."""
    n, col = len(summary["seeds"]), summary["collapse"]
    gone = col["seeds"]
    lines = [f"{summary['task']}: {n} seeds ({', '.join(map(str, summary['seeds']))}) in {out}, on dev",
             f"  {'metric':16s} {'mean':>8s} {'std':>8s} {'min':>8s} {'max':>8s}  collapsed"]
    for k, s in summary["metrics"].items():
        lines.append(f"  {k:16s} {_num(s['mean']):>8s} {_num(s['std']):>8s} {_num(s['min']):>8s} "
                     f"{_num(s['max']):>8s}  " + ("-" if gone is None else f"{len(gone)} of {n}"))
    lines.append(f"  collapsed: {col['why']}" if gone is None
                 else f"  collapsed ({col['rule']}): " + (", ".join(f"seed {s}" for s in gone) or "none"))
    main = summary["main_metric"]
    lines.append(f"  chosen: seed {summary['chosen_seed']} ({main} {_num(summary['chosen_dev'].get(main))}), "
                 f"the best on dev, so that score is optimistic; {out} holds its model")
    return lines


def read_summary(model_dir: str | Path) -> dict | None:
    """A model folder's seeds.json (None when it is no `--seeds` run)."""
    try:
        return json.loads((Path(model_dir) / SUMMARY).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def spread_text(summary: dict, metric: str) -> str:
    """`bertkit evaluate`'s note beside a metric: its spread over the seeds on fine-tuning's dev."""
    s = summary["metrics"].get(metric)
    if not s or s["mean"] is None:
        return ""
    return (f"   (seeds on dev: mean {_num(s['mean'])}, std {_num(s['std'])}, "
            f"{_num(s['min'])}-{_num(s['max'])})")


def spread_footer(summary: dict) -> str:
    gone = summary["collapse"]["seeds"]
    return (f"  this model is seed {summary['chosen_seed']} of {len(summary['seeds'])} "
            f"({', '.join(map(str, summary['seeds']))}"
            + ("" if gone is None else f"; {len(gone)} collapsed") +
            f"), picked on fine-tuning's dev ({summary['dev_file']}): its score there is optimistic")
