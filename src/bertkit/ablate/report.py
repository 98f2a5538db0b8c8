"""The ablation grid's statistics and report: OUT/results.jsonl, OUT/REPORT.md, OUT/plots/*.png.

Reads only what the arms wrote (OUT/arms/NAME/arm.json and results.jsonl), so any machine sharing
OUT can write it at any time (`bertkit ablate CONFIG --report-only`): finished arms are rows with
numbers, failed ones a row with their one-line error, the others 'not run' (or 'running').

Per arm and task: the mean, sample standard deviation and min-max of the dev metric over the
fine-tuning seeds (with the seeds that collapsed to one class, and the learning rate chosen on dev),
and against the base arm the difference of means with Welch's 95% confidence interval (`difference_ci`:
the t quantile from `t_quantile`, exact to ~1e-12), marked when it excludes 0, and the p-value of
Welch's unequal-variance t-test (scipy's when installed, else `welch_t_test` here).
"""
from __future__ import annotations

import logging
import math
import time
import warnings
from pathlib import Path
from typing import Sequence

from ..outdir import write_whole
from ..sources import read_jsonl
from .arm import _write_rows, finished, probe_dir
from .cards import as_trained_section, checklist_section
from .config import AblateConfig, _read_json, describe
from .measure import OUTCOMES, _fmt, _minutes, _tokens, delta_cell, paired_mlm_difference, paired_ratio_difference
from .plots import write_plots
from .zeroshot import blimp_section, nsp_section

log = logging.getLogger("bertkit")


# ---- statistics -----------------------------------------------------------------------------------
def _mlm_outcomes(cfg: AblateConfig, name: str) -> dict:
    return _read_json(Path(cfg.out) / "arms" / name / OUTCOMES) or {}


def _mlm_delta(cfg: AblateConfig, state: dict, base: dict) -> str:
    """The report's 'Δ at [MASK] vs base' cell: the paired difference on the same held-out positions."""
    pre = state.get("pretrain") or {}
    if state["name"] == cfg.base_arm or (pre.get("model_from") == cfg.base_arm and not pre.get("checkpoint")):
        return "base"
    if state.get("status") in ("done", "pretrained") and state.get("mlm") is None:
        return "n/a"                                   # a left-to-right model has no MLM objective
    own = state["name"] if not pre.get("model_from") or pre.get("checkpoint") else pre["model_from"]
    return delta_cell(paired_mlm_difference(_mlm_outcomes(cfg, own), base))


def mean_std(xs: Sequence[float]) -> tuple[float, float]:
    n = len(xs)
    m = sum(xs) / n
    return m, (math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)) if n > 1 else float("nan"))


def _welch(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """(mean(a) - mean(b), its standard error, Welch-Satterthwaite degrees of freedom; nan when neither varies)."""
    (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
    va, vb = sa * sa / len(a), sb * sb / len(b)
    if va + vb == 0:
        return ma - mb, 0.0, float("nan")
    df = (va + vb) ** 2 / ((va * va / (len(a) - 1) if va else 0) + (vb * vb / (len(b) - 1) if vb else 0))
    return ma - mb, math.sqrt(va + vb), df


def welch_t_test(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """Welch's unequal-variance t-test: (t, degrees of freedom, two-sided p)."""
    delta, se, df = _welch(a, b)
    if se == 0:
        return (0.0, df, 1.0) if delta == 0 else (math.copysign(math.inf, delta), df, 0.0)
    t = delta / se
    return t, df, betainc(df / 2, 0.5, df / (df + t * t))


def t_quantile(q: float, df: float) -> float:
    """The q quantile (0.5 <= q < 1) of Student's t with df degrees of freedom: the t whose two-sided
    tail I_{df/(df+t^2)}(df/2, 1/2) is 2 (1 - q), by bisection (to ~1e-12)."""
    tail = 2 * (1 - q)

    def beyond(t: float) -> float:
        return betainc(df / 2, 0.5, df / (df + t * t))

    lo, hi = 0.0, 1.0
    while beyond(hi) > tail:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-12 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if beyond(mid) > tail else (lo, mid)
    return (lo + hi) / 2


def difference_ci(a: Sequence[float], base: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """Welch's confidence interval of mean(a) - mean(base): the difference -/+ the t quantile at the
    Welch-Satterthwaite degrees of freedom x its standard error. None with fewer than 2 values on a
    side; a single point when neither side varies."""
    if len(a) < 2 or len(base) < 2:
        return None
    delta, se, df = _welch(a, base)
    half = t_quantile(0.5 + level / 2, df) * se if se else 0.0
    return delta - half, delta + half


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) (continued fraction, Numerical Recipes 6.4)."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1) / (a + b + 2):
        return 1.0 - betainc(b, a, 1.0 - x)
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-14:
            break
    return front * f / a


def compare(a: Sequence[float], base: Sequence[float]) -> tuple[float, float | None, str]:
    """(difference of means, p-value or None, which test)."""
    (ma, sa), (mb, sb) = mean_std(a), mean_std(base)
    if len(a) < 2 or len(base) < 2:
        return ma - mb, None, "none (fewer than 2 seeds)"
    try:
        from scipy import stats
        if sa == 0 and sb == 0:
            raise ImportError  # scipy returns nan here; ours says what it means
        with warnings.catch_warnings():            # "nearly identical data": the p-value is still right
            warnings.simplefilter("ignore", RuntimeWarning)
            return ma - mb, float(stats.ttest_ind(a, base, equal_var=False).pvalue), "Welch's t-test (scipy)"
    except ImportError:
        return ma - mb, welch_t_test(a, base)[2], "Welch's t-test (bertkit.ablate.report.welch_t_test)"


# ---- report -------------------------------------------------------------------------------------
def collect(cfg: AblateConfig) -> tuple[list[dict], list[dict]]:
    """(arm states in config order, result rows) from OUT/arms; arms never run get a 'not run' state."""
    states, rows = [], []
    for arm in cfg.arms:
        d = Path(cfg.out) / "arms" / arm.name
        st = _read_json(d / "arm.json") or {"name": arm.name, "status": "not run"}
        st["setting"] = describe(arm)
        if st.get("status") in ("done", "pretrained") and not finished(cfg, arm, pretrain_only=True):
            st["status"] = "stale"
            st["error"] = "finished with other settings (or on a model since trained again); rerun the grid to redo it"
        states.append(st)
        if st["status"] == "done":
            rows += read_jsonl(d / "results.jsonl")
    return states, rows


def write_report(cfg: AblateConfig, command: str = "") -> Path:
    """OUT/results.jsonl, OUT/REPORT.md and OUT/plots/*.png over the finished arms."""
    from ..hardware import git_commit, machine_facts

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    states, rows = collect(cfg)
    failed_rows = [{"arm": s["name"], "setting": s["setting"], "status": s["status"], "error": s.get("error"),
                    "stage": s.get("stage")} for s in states if s["status"] in ("failed", "interrupted")]
    _write_rows(out / "results.jsonl", rows + failed_rows)
    hw = machine_facts()
    header = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "commit": git_commit(), "cpu": hw.get("cpu"),
              "gpu": hw.get("gpu"), "torch": hw.get("torch"), "threads": cfg.threads or hw.get("torch_threads")}
    plots = write_plots(cfg, states, rows, summarize(cfg, rows)[0], out / "plots", header)
    write_whole(out / "REPORT.md", report_markdown(cfg, states, rows, header, command, plots))
    log.info("ablate: report %s (%d of %d arms finished, %d more pre-trained and scored)", out / "REPORT.md",
             sum(s["status"] == "done" for s in states), len(states), sum(s["status"] == "pretrained" for s in states))
    return out / "REPORT.md"


def summarize(cfg: AblateConfig, rows: list[dict]) -> tuple[dict, list[str]]:
    """({(arm, task): {values, mean, std, min, max, n, metric, collapsed, collapse_known, lr, delta, p,
    ci, beyond}}, the tests used): deltas against the base arm with Welch's 95% interval; `beyond`:
    the interval excludes 0. `collapsed`: seeds whose dev predictions were all one class (of
    `collapse_known` that recorded it); `lr`: the rate chosen on dev (None without a search)."""
    cells: dict = {}
    for r in rows:
        if r.get("status") == "ok" and r.get("value") is not None and not r.get("probe"):   # probes: probe_section
            c = cells.setdefault((r["arm"], r["task"]), {"values": [], "metric": r["metric"], "collapsed": 0,
                                                         "collapse_known": 0, "lr": None})
            c["values"].append(float(r["value"]))
            c["collapsed"] += r.get("collapsed") is True
            c["collapse_known"] += r.get("collapsed") is not None
            if r.get("lr_candidates"):
                c["lr"] = r.get("lr")
    tests = set()
    for (arm, task), c in cells.items():
        c["n"] = len(c["values"])
        c["mean"], c["std"] = mean_std(c["values"])
        c["min"], c["max"] = min(c["values"]), max(c["values"])
        base = cells.get((cfg.base_arm, task))
        if base and arm != cfg.base_arm:
            c["delta"], c["p"], test = compare(c["values"], base["values"])
            c["ci"] = difference_ci(c["values"], base["values"])
            c["beyond"] = c["ci"] is not None and (c["ci"][0] > 0 or c["ci"][1] < 0)
            tests.add(test)
    return cells, sorted(tests)


def lr_candidates(rows: list[dict]) -> dict:
    """{(arm, task): {scores: {lr: [dev values of the candidate runs]}, chosen, diverged: rates whose run's
    loss stopped being finite}} of the lr searches."""
    out: dict = {}
    for r in rows:
        if r.get("status") == "lr_candidate":
            c = out.setdefault((r["arm"], r["task"]), {"scores": {}, "chosen": None, "diverged": set()})
            c["scores"].setdefault(r.get("lr"), []).append(r.get("value"))
            if r.get("diverged"):
                c["diverged"].add(r.get("lr"))
            if r.get("chosen"):
                c["chosen"] = r.get("lr")
    return out


def report_markdown(cfg: AblateConfig, states: list[dict], rows: list[dict], header: dict, command: str,
                    plots: list[Path]) -> str:
    cells, _ = summarize(cfg, rows)
    tasks = list(cfg.tasks)
    metric = {t: next((r["metric"] for r in rows if r["task"] == t), "metric") for t in tasks}
    done = sum(s["status"] == "done" for s in states)
    scored = sum(s["status"] == "pretrained" for s in states)
    b = cfg.budget
    base = next((s.get("pretrain") or {} for s in states if s["name"] == cfg.base_arm), {})
    shape = (f"global batch {base['global_batch']} x length {base['sequence_lengths'][0]} = "
             f"{b.steps * base['global_batch'] * base['sequence_lengths'][0] / 1e6:.2f}M token slots"
             if base.get("global_batch") and base.get("sequence_lengths") else "the global batch x the sequence length")
    match = (f"**training tokens**: {b.steps} updates x {shape} for every arm (unless the arm changes "
             "it); wall time is recorded, not matched" if b.match == "tokens" else
             f"**training FLOPs**: every arm gets the FLOPs of the base arm's {b.steps} updates (x {shape}), "
             "counted per update from its settings, so a costlier update gets fewer of them" if b.match == "flops"
             else f"**wall time**: {b.time} of pre-training per arm; the tokens each arm saw are recorded")
    lines = [f"# Ablation grid: {Path(cfg.source).name}", "",
             f"{header['date']} · commit {header['commit']} · CPU {header['cpu']}"
             + (f" · GPU {header['gpu']}" if header.get("gpu") else "")
             + f" · torch {header['torch']}, threads {header['threads']}", "",
             f"Command: `{command or 'bertkit ablate ' + cfg.source}`", "",
             f"{done} of {len(states)} arms finished"
             + (f", {scored} more pre-trained and scored (not fine-tuned yet)" if scored else "")
             + f". Budget matched by {match}. Same tokenizer ({cfg.tokenizer}) and the same held-out documents "
             f"({cfg.eval_documents}) for every arm.", "",
             unigram_line(states), "",
             "| arm | setting | pretrain tokens | pretrain FLOPs (updates) | wall: pretrain / arm | "
             "MLM acc at [MASK] | Δ at [MASK] vs base [95%] | MLM acc, all targets | "
             + " | ".join(f"{t} {metric[t]} | Δ {t} [95% CI]" for t in tasks) + " | status |",
             "|---|---|---:|---:|---:|---:|---:|---:|" + "---:|---:|" * len(tasks) + "---|"]
    base_outcomes = _mlm_outcomes(cfg, cfg.base_arm)
    machines = {s.get("cpu") for s in states if s.get("cpu")}
    lines += [_arm_row(cfg, s, tasks, cells, base_outcomes) for s in states]
    lines += _how_to_read(cfg, tasks, metric)
    lines += blimp_section(cfg, states) + nsp_section(states) + probe_section(cfg, rows)
    lines += _variance_section(cfg, cells, tasks, metric) + lr_section(cfg, rows)
    lines += [""] + as_trained_section(cfg, states) + [""] + checklist_section(cfg, states)
    if len(machines) > 1:
        lines += ["", f"Arms ran on {len(machines)} machines: {', '.join(sorted(machines))} (wall times differ "
                  "by machine)."]
    lines += ["", "Each arm's run cards: `arms/NAME/pretrain/run_card.md` and "
              "`arms/NAME/finetune/TASK/seedS/run_card.md` (`TASK/lrR/seedS` with an lr search); all rows: "
              "`results.jsonl` (the lr search's candidate runs: status `lr_candidate`)."]
    lines += [""] + [f"![{p.stem}](plots/{p.name})" for p in plots]
    return "\n".join(lines) + "\n"


def _arm_row(cfg: AblateConfig, s: dict, tasks: list[str], cells: dict, base_outcomes) -> str:
    """One arm's row of the main table: its pre-training, held-out MLM, each task's cells, its status."""
    pre = s.get("pretrain") or {}
    mlm = s.get("mlm")
    acc, acc_mask = _fmt((mlm or {}).get("accuracy")), _fmt((mlm or {}).get("accuracy_mask"))
    if s["status"] == "done" and mlm is None:
        own = (pre.get("own_eval") or {}).get("eval_next_token_accuracy")
        acc_mask, acc = "n/a (causal)", "n/a" + (f" (next-token acc {own:.3f})" if own is not None else "")
    if pre.get("checkpoint"):
        tokens = f"{_tokens(pre.get('tokens'))} ({pre['model_from']} at update {pre['checkpoint']})"
        wall = f"{_minutes(pre.get('wall_s'))} (in {pre['model_from']}) / {_minutes(s.get('wall_s'))}"
    elif pre.get("model_from"):
        tokens, wall = f"{_tokens(pre.get('tokens'))} ({pre['model_from']}'s)", f"0 / {_minutes(s.get('wall_s'))}"
    else:
        tokens = _tokens(pre.get("tokens")) if pre else "—"
        wall = f"{_minutes(pre.get('wall_s'))} / {_minutes(s.get('wall_s'))}" if pre else "—"
    budget = s.get("budget") or {}
    flops = f"{budget['flops']:.2e} ({budget['updates']})" if budget.get("flops") else "—"
    row = [s["name"], s["setting"].replace("|", "/"), tokens, flops, wall, acc_mask,
           _mlm_delta(cfg, s, base_outcomes), acc]
    for t in tasks:
        row += _task_cells(cells.get((s["name"], t)), s["name"] == cfg.base_arm)
    err = s.get("error") or ""
    err = err if len(err) <= 160 else err[:157] + "..."
    status = s["status"] if s["status"] in ("done", "not run") else f"{s['status']}: {err}"
    if s["status"] == "pretrained":
        status = "pre-trained and scored; not fine-tuned yet (--pretrain-only)"
    if s["status"] == "running":
        status = f"running on {s.get('host')} since {s.get('started')}"
    if s["status"] == "failed" and s.get("stage"):
        status += f" (at {s['stage']})"
    row.append(status.replace("|", "/"))
    return "| " + " | ".join(row) + " |"


def _how_to_read(cfg: AblateConfig, tasks: list[str], metric: dict) -> list[str]:
    """What the main table's columns mean, under it."""
    return ["", "How to read it:", "",
            f"- Each task cell: dev {', '.join(f'{t} {metric[t]}' for t in tasks)} after the last fine-tuning "
            "epoch (no checkpoint chosen on dev), mean ± sample standard deviation, min–max over the seeds "
            "(n; with an lr search the rate chosen on dev; 'k of n collapsed': seeds whose dev predictions "
            "were all one class - for tagging, no entity - counted in the mean).",
            f"- Δ: difference of means against the base arm `{cfg.base_arm}` with Welch's 95% confidence "
            "interval (t distribution, Welch-Satterthwaite degrees of freedom); * = the interval excludes 0 "
            f"(Welch's t-test p < 0.05): the difference is beyond seed noise. With {len(cfg.seeds)} seeds only "
            "large effects are detectable: no * means 'within seed noise', not 'no effect'.",
            "- MLM acc: one protocol for every arm (token masking, 15% of tokens, 80/10/10, the same positions), "
            "on documents no arm trained on. At [MASK]: the positions shown as [MASK] only (the headline: the "
            "10% of targets left visible are free for an arm that learnt to copy them); all targets: BERT's "
            "figure. n/a for a left-to-right model (no MLM objective). Δ at [MASK]: the arm minus the base on "
            "the same positions, with the 95% interval clustered by sequence (* = excludes 0): evaluation noise "
            "only; one pre-training per arm, so pre-training-seed noise is not in it.",
            "- Pretrain tokens: real (non-padding) tokens the arm's pre-training saw; FLOPs: its training FLOPs "
            "counted from its settings (6 x matmul weights x token slots + attention + the output projection "
            "at the positions its objective predicts), with its updates; wall: its pre-training time / the "
            "whole arm's (pre-training, held-out MLM and every fine-tuning run).",
            ""]


def _task_cells(c: dict | None, is_base: bool) -> list[str]:
    """An arm's two cells of a task: mean ± std, min-max (seeds, the lr chosen on dev, seeds collapsed to
    one class), and the difference from the base with its 95% interval (* when it excludes 0)."""
    if not c:
        return ["—", "—"]
    extra = [str(c["n"])] + ([f"lr {c['lr']:g}"] if c.get("lr") is not None else [])
    if c["collapsed"]:
        extra.append(f"{c['collapsed']} of {c['collapse_known']} collapsed")
    cell = f"{c['mean']:.3f} ± {_fmt(c['std'])}, {c['min']:.3f}–{c['max']:.3f} ({', '.join(extra)})"
    if is_base:
        return [cell, "base"]
    if "delta" not in c:
        return [cell, "—"]
    ci = f" [{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}]" if c.get("ci") else " (too few seeds)"
    return [cell, f"{c['delta']:+.3f}{ci}{' *' if c.get('beyond') else ''}"]


def unigram_line(states: list[dict]) -> str:
    """The held-out MLM accuracy of always guessing the most common target token (the unigram stage)."""
    uni = next(((s.get("mlm") or {}).get("unigram") for s in states if (s.get("mlm") or {}).get("unigram")), None)
    if not uni:
        return "Unigram baseline: — (no arm has scored held-out MLM at [MASK] positions yet)."
    return (f"Unigram baseline: always guessing the most common target token `{uni['token']}` scores "
            f"{uni['share_mask']:.3f} at [MASK] positions ({uni['share']:.3f} of all targets); an arm at that "
            "accuracy has learnt word frequencies, not context.")


def lr_section(cfg: AblateConfig, rows: list[dict]) -> list[str]:
    """Each lr search: the dev mean of every candidate rate, the chosen one in bold."""
    found = lr_candidates(rows)
    if not found:
        return []
    rates = sorted({lr for c in found.values() for lr in c["scores"]})
    out = ["", "## Learning rate chosen on dev", "",
           f"Per arm x task, each candidate's dev mean over the seeds it ran at ({(cfg.lr_search or {}).get('seeds', 'first')}"
           " seed(s)); the best was kept and every seed reported at it (the selection runs are among the reported "
           "seeds, so the chosen cell is slightly optimistic, the same way for every arm).", "",
           "| arm | task | " + " | ".join(f"lr {lr:g}" for lr in rates) + " |", "|---|---|" + "---:|" * len(rates)]
    for (arm, task), c in found.items():
        cells = []
        for lr in rates:
            vals = [v for v in c["scores"].get(lr, []) if v is not None]
            text = f"{sum(vals) / len(vals):.3f}" if vals else "diverged" if lr in c["diverged"] else "—"
            cells.append(f"**{text}**" if lr == c["chosen"] else text)
        out.append(f"| {arm} | {task} | " + " | ".join(cells) + " |")
    return out


def probe_section(cfg: AblateConfig, rows: list[dict]) -> list[str]:
    """The logistic-regression probes (deterministic: one number per task x features x pooling, no seeds):
    one row per task and variant, one column per probe arm with its paired Δ on the same dev examples
    against the base model's probe arm (that one against the random model's), the majority class beside."""
    probes = [r for r in rows if r.get("probe") and r.get("status") == "ok"]
    if not probes:
        return []
    arms = list(dict.fromkeys(r["arm"] for r in probes))
    given = {a.name: a for a in cfg.arms}
    sources = {a.name: a.model_from for a in cfg.arms}
    base = next((a for a in arms if sources.get(a) == cfg.base_arm and not given[a].checkpoint), None)
    random = next((a for a in arms if sources.get(a) in given and not given[sources[a]].pretrained), None)
    against = {a: ref for a in arms if (ref := random if a == base else base) not in (None, a)}
    vs_random = f"; `{base}` minus `{random}`, random weights" if base in against else ""
    cell = {(r["arm"], r["task"], r["variant"]): r for r in probes}
    keys = list(dict.fromkeys((r["task"], r["variant"]) for r in probes))
    out = ["## Frozen-feature probes", "",
           "Logistic regression on each arm's frozen features (L-BFGS to convergence, C chosen by cross-validation "
           "on the training data among the values solved in every fold; deterministic, so no seeds): the paper's "
           "feature-based approach (Table 7's layers; [CLS] or mean pooling for sentence tasks). Dev score, with the chosen C; † = not converged. "
           "Majority: always answering the training majority class (tagging: no entity)."
           + (f" Δ: the arm minus `{base}` (the base model's probes{vs_random}) on the same dev examples and "
              "features, with the 95% interval of a paired difference of ratios of sums (accuracy; F1 = 2 TP / "
              "(predicted + true)): delta method, each example a cluster; * = excludes 0. Dev-set noise only (the "
              "probes are deterministic); n/a: a metric that is no ratio of sums (MCC, correlations)."
              if against else ""), "",
           "| task | features | " + " | ".join(f"{a} ({sources.get(a) or '?'})" + (f" | Δ vs {against[a]} [95%]"
                                                 if a in against else "") for a in arms) + " | majority |",
           "|---|---|" + "---:|" * (len(arms) + len(against) + 1)]
    outcomes: dict = {}
    for task, variant in keys:
        row, majority = [task, variant], None
        for a in arms:
            r = cell.get((a, task, variant))
            if r is None:
                row += ["—"] * (1 + (a in against))
                continue
            majority = r.get("majority") if majority is None else majority
            row.append(f"{r['value']:.3f} (C {r['C']:g}){'' if r.get('converged') else ' †'}")
            if a in against:
                row.append(_probe_delta(cfg, r, against[a], outcomes))
        out.append("| " + " | ".join(row + [_fmt(majority)]) + " |")
    return out + [""]


def _probe_delta(cfg: AblateConfig, r: dict, ref: str, cache: dict) -> str:
    """The cell of row `r`'s paired difference from probe arm `ref` (same task, features and pooling)."""
    def outcomes(arm: str):
        if (arm, r["task"]) not in cache:          # {(features, pooling): (dev ids, {num, den} or None)}
            result = _read_json(probe_dir(Path(cfg.out) / "arms" / arm, r["task"]) / "results.json") or {}
            cache[arm, r["task"]] = {(p.get("features"), p.get("pooling")): (result["dev_ids"], p.get("outcomes"))
                                     for p in result.get("probes") or []} if result.get("dev_ids") else {}
        return cache[arm, r["task"]].get((r["probe_features"], r["probe_pooling"]))

    a, b = outcomes(r["arm"]), outcomes(ref)
    if not a or not b or a[0] != b[0]:
        return "—"                                 # not run, written before outcomes were kept, other examples
    if a[1] is None or b[1] is None:
        return "n/a"
    return delta_cell(paired_ratio_difference(a[1]["num"], a[1]["den"], b[1]["num"], b[1]["den"]))


def _variance_section(cfg: AblateConfig, cells: dict, tasks: list[str], metric: dict) -> list[str]:
    """Fine-tuning variance (the paper note's failure mode 6): the base arm's seeds, and the spread."""
    if not cells:
        return ["## Fine-tuning variance", "", "(no arm has been fine-tuned yet)", ""]
    out = ["## Fine-tuning variance", "",
           "| task | base arm's seeds | base std | median std over arms | largest max−min (arm) |",
           "|---|---|---:|---:|---|"]
    for t in tasks:
        base = cells.get((cfg.base_arm, t))
        per = [(a, c) for (a, tt), c in cells.items() if tt == t]
        if not per:
            continue
        stds = sorted(c["std"] for _, c in per if not math.isnan(c["std"]))
        arm, widest = max(per, key=lambda ac: max(ac[1]["values"]) - min(ac[1]["values"]))
        out.append(f"| {t} {metric[t]} | {', '.join(f'{v:.3f}' for v in base['values']) if base else '—'} | "
                   f"{_fmt(base['std']) if base else '—'} | {_fmt(stds[len(stds) // 2] if stds else None)} | "
                   f"{max(widest['values']) - min(widest['values']):.3f} ({arm}) |")
    return out
