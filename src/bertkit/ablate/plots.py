"""The ablation grid's plots (OUT/plots/*.png): fine-tuning per task (mean ± std, seeds as dots),
held-out MLM accuracy at [MASK] per arm with the unigram line, BLiMP per arm with its interval."""
from __future__ import annotations

import logging
from pathlib import Path

from .config import AblateConfig

log = logging.getLogger("bertkit")


def write_plots(cfg: AblateConfig, states: list[dict], rows: list[dict], cells: dict, d: Path, header: dict
                ) -> list[Path]:
    """Bar charts: each task's mean with a ±std bar and the seeds as dots (`cells`: report.summarize's),
    held-out MLM accuracy per arm, BLiMP per arm."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("ablate: matplotlib is not installed: no plots (pip install 'bertkit[plot]')")
        return []
    d.mkdir(parents=True, exist_ok=True)
    stamp = f"{header['date']} · {header['commit']} · {header['cpu']}"
    names = [s["name"] for s in states]
    colors = ["tab:orange" if n == cfg.base_arm else "tab:blue" for n in names]
    tasks = list(cfg.tasks)
    fig, axes = plt.subplots(len(tasks), 1, figsize=(max(8, 0.45 * len(names) + 2), 3.2 * len(tasks)), squeeze=False)
    for ax, t in zip(axes[:, 0], tasks):
        means = [cells[(n, t)]["mean"] if (n, t) in cells else float("nan") for n in names]
        stds = [cells[(n, t)]["std"] if (n, t) in cells else 0.0 for n in names]
        ax.bar(range(len(names)), means, yerr=stds, color=colors, capsize=3, alpha=0.8)
        for i, n in enumerate(names):
            vals = cells.get((n, t), {}).get("values", [])
            ax.plot([i] * len(vals), vals, "k.", ms=4)
        if (cfg.base_arm, t) in cells:
            ax.axhline(cells[(cfg.base_arm, t)]["mean"], color="tab:orange", ls="--", lw=1)
        metric = next((r["metric"] for r in rows if r["task"] == t), "")
        ax.set_ylabel(f"{t} dev {metric}")
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
        if seen := [v for n in names for v in cells.get((n, t), {}).get("values", [])]:
            ax.set_ylim(max(0.0, min(seen) - 0.05), min(1.0, max(seen) + 0.05))
        for i, s in enumerate(states):
            if (s["name"], t) not in cells:
                ax.text(i, ax.get_ylim()[0], f" {s['status']}", rotation=90, va="bottom", ha="center", fontsize=7)
    fig.suptitle(f"fine-tuning, mean ± std over {len(cfg.seeds)} seeds (dots: seeds)\n{stamp}", fontsize=9)
    paths = [_save(plt, fig, d / "downstream.png")]
    accs = [(s.get("mlm") or {}).get("accuracy_mask") for s in states]
    fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(names) + 2), 3.6))
    ax.bar(range(len(names)), [a if a is not None else float("nan") for a in accs], color=colors)
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("held-out MLM accuracy at [MASK]")
    uni = next(((s.get("mlm") or {}).get("unigram") for s in states if (s.get("mlm") or {}).get("unigram")), None)
    if uni:
        ax.axhline(uni["share_mask"], color="gray", ls=":", lw=1, label=f"unigram ({uni['token']})")
        ax.legend(fontsize=8)
    ax.set_title(f"held-out MLM accuracy at [MASK] positions (token 15%, 80/10/10, same positions)\n{stamp}",
                 fontsize=9)
    paths.append(_save(plt, fig, d / "mlm_accuracy.png"))
    if scored := [s for s in states if isinstance(s.get("blimp"), dict)]:
        paths.append(_blimp_plot(plt, cfg, scored, d / "blimp.png", stamp))
    return paths


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _blimp_plot(plt, cfg: AblateConfig, scored: list[dict], path: Path, stamp: str) -> Path:
    """BLiMP accuracy per arm with its Wilson 95% interval, chance and the 5-gram model as lines."""
    from .. import blimp

    names = [s["name"] for s in scored]
    acc = [s["blimp"]["accuracy"] for s in scored]
    err = [[a - s["blimp"]["low"] for a, s in zip(acc, scored)], [s["blimp"]["high"] - a for a, s in zip(acc, scored)]]
    fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(names) + 2), 3.6))
    ax.bar(range(len(names)), acc, yerr=err, capsize=3,
           color=["tab:orange" if n == cfg.base_arm else "tab:blue" for n in names])
    ax.axhline(0.5, color="gray", ls=":", lw=1, label="chance")
    try:
        ref = blimp.published()
        ngram = sum(r["ngram"] for r in ref.values()) / len(ref)
        ax.axhline(ngram / (100 if ngram > 1 else 1), color="tab:green", ls="--", lw=1, label="5-gram (BLiMP paper)")
    except Exception:  # noqa: BLE001 - the anchor is context
        pass
    ax.legend(fontsize=8)
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("BLiMP accuracy")
    ax.set_ylim(0.4, max(0.8, max(acc) + 0.05))
    ax.set_title(f"BLiMP zero-shot, {scored[0]['blimp']['pairs']:,} pairs (95% Wilson intervals)\n{stamp}", fontsize=9)
    return _save(plt, fig, path)
