"""What a run leaves behind: metrics as JSONL, a run card (markdown + JSON), a PNG of the curves,
plus the FLOP model used to compute MFU (the machine's facts are `hardware.machine_facts`).

FLOP model (BASELINES.md): a multiply-add is 2 FLOPs; a forward pass costs 2 x (matmul weights)
x tokens + 4 T^2 C L per sequence, plus the MLM head on the M predicted tokens, 2 (C^2 + C V) M,
and the NSP head; a training step costs 3 x forward. MFU = achieved / best GEMM measured in the
same process (`hardware.gemm_peak`).
"""
from __future__ import annotations

import datetime
import json
import logging
import math
import re
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .data.masking import MaskingConfig
from .hardware import dtype_name, gemm_peak, machine_facts
from .model import num_parameters
from .runconfig import to_dict
from .runstate import Run, Step

log = logging.getLogger("bertkit")


# ---- metrics -------------------------------------------------------------------------------------
class MetricsLog:
    """Append-only JSONL, one object per line. On resume, lines past the resumed step are dropped,
    so the file of a resumed run equals that of an uninterrupted one."""

    def __init__(self, path: str | Path, keep_until_step: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if keep_until_step is None:
            self.path.unlink(missing_ok=True)
        elif self.path.exists():
            kept = [line for line in self.path.read_text(encoding="utf-8").splitlines()
                    if (step := _step_of(line)) is not None and step <= keep_until_step]
            self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        """One line; NaN / inf become null (strict JSON)."""
        record = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=False) + "\n")


def _step_of(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


# ---- FLOPs ---------------------------------------------------------------------------------------
def matmul_weights(cfg) -> int:
    """Parameters that take part in matmuls per token in the encoder: L (4 C^2 + 2 C d_ff)."""
    C = cfg.hidden_size
    return cfg.num_layers * (4 * C * C + 2 * C * cfg.intermediate_size)


def step_flops(cfg, tokens: int, sequences: int, seq_len: float, masked: int, nsp: bool = True) -> float:
    """FLOPs of one training step (forward + backward = 3 x forward) on this much data.

    `tokens` are the tokens the encoder processes (real tokens when packed, B x T when padded)."""
    C, L, V = cfg.hidden_size, cfg.num_layers, cfg.vocab_size
    fwd = 2 * matmul_weights(cfg) * tokens + 4 * seq_len * seq_len * C * L * sequences
    fwd += 2 * (C * C + C * V) * masked
    if nsp:
        fwd += 2 * (C * C + 2 * C) * sequences
    return 3.0 * fwd


# ---- the training loop's log window and progress bar -------------------------------------------------
class Window:
    """Sums between two log lines; a record is the window's averages (tokens/s over its wall time)."""

    def __init__(self):
        self.t0, self.n, self.sums = time.perf_counter(), 0, {}

    def add(self, s: Step) -> None:
        """Add one update (`runstate.Step`)."""
        self.n += 1
        self.last = s
        for k in ("loss", "mlm_loss", "nsp_loss", "mlm_correct", "mlm_count", "nsp_correct", "nsp_count",
                  "tokens", "flops"):
            self.sums[k] = self.sums.get(k, 0.0) + getattr(s, k)

    def record(self, st, run: Run) -> dict:
        """Averages over the window; a left-to-right run (train.objective=clm) names its head's
        figures next_token_loss / next_token_accuracy instead of mlm_*."""
        dt = max(time.perf_counter() - self.t0, 1e-9)
        n, s = max(self.n, 1), self.sums
        lm = "next_token" if run.cfg.train.objective == "clm" else "mlm"
        return {"step": st.step, "loss": s["loss"] / n, f"{lm}_loss": s["mlm_loss"] / n,
                "nsp_loss": s["nsp_loss"] / n if run.cfg.train.nsp else None,
                f"{lm}_accuracy": s["mlm_correct"] / max(s["mlm_count"], 1),
                "nsp_accuracy": s["nsp_correct"] / s["nsp_count"] if s["nsp_count"] else None,
                "lr": self.last.lr, "grad_norm": self.last.grad_norm, "tokens_per_s": s["tokens"] / dt,
                "flops_per_s": s["flops"] / dt, "tokens": st.tokens, "elapsed_s": round(st.elapsed, 3),
                "phase": st.phase, "skipped": st.skipped}


def progress_bar(cfg, st, world, total: int):
    """A progress bar over the run's `total` updates on a terminal; in a log or a pipe, a one-line
    status every 30 seconds instead (`StatusLine`: a bar redrawn into a file is one endless line).
    None when progress is off."""
    if not (cfg.train.progress and world.main):
        return None
    initial = min(st.step, total)
    fmt = "{desc} {percentage:3.0f}%|{bar}| update {n_fmt}/{total_fmt} [{elapsed}<{remaining}]{postfix}"
    if not _on_terminal():
        return StatusLine(total, initial)
    return tqdm(total=total, initial=initial, desc="pretrain", bar_format=fmt, dynamic_ncols=True)


def _on_terminal() -> bool:
    return sys.stderr.isatty()


class StatusLine:
    """What a log gets instead of a progress bar: `pretrain: update 120/2000 (6%), 95 s, loss 6.912, ...`
    every `every` seconds. Has the few methods of tqdm that the loop uses (update, set_postfix, write, close)."""

    def __init__(self, total: int, initial: int = 0, every: float = 30.0):
        self.total, self.n, self.every = total, initial, every
        self.postfix: dict = {}
        self.t0 = self.last = time.perf_counter()

    def update(self, k: int = 1) -> None:
        self.n += k
        now = time.perf_counter()
        if now - self.last >= self.every:
            self.last = now
            log.info("%s", self.line())

    def line(self) -> str:
        pct = 100.0 * self.n / self.total if self.total else 0.0
        post = "".join(f", {k} {v}" for k, v in self.postfix.items())
        return f"pretrain: update {self.n}/{self.total} ({pct:.0f}%), {time.perf_counter() - self.t0:.0f} s{post}"

    def set_postfix(self, post: dict, refresh: bool = False) -> None:
        self.postfix = dict(post)

    def write(self, msg: str) -> None:
        log.info("%s", msg)

    def close(self) -> None:
        pass


def bar_update(bar, run: Run, s: Step) -> None:
    st = run.state
    bar.update(1)
    if st.step % max(1, min(run.cfg.train.log_every, 10)) == 0:
        head = "next" if run.cfg.train.objective == "clm" else "mlm"
        post = {"loss": f"{s.loss:.3f}", head: f"{s.mlm_correct / max(s.mlm_count, 1):.3f}",
                **({"nsp": f"{s.nsp_correct / s.nsp_count:.3f}"} if s.nsp_count else {}),
                "tok/s": f"{st.tokens / max(st.elapsed, 1e-9):.0f}", "lr": f"{s.lr:.2e}"}
        bar.set_postfix(post, refresh=False)


def tensorboard_writer(out: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        log.warning("train.tensorboard: the tensorboard package is not installed; skipping")
        return None
    return SummaryWriter(str(out / "tensorboard"))


def to_board(board, group: str, rec: dict, step: int) -> None:
    """A metrics record's numbers as TensorBoard scalars `group/name` (the group's prefix off the name:
    eval_mlm_loss -> eval/mlm_loss); nothing without a writer."""
    if board is not None:
        for k, v in rec.items():
            if isinstance(v, (int, float)) and k != "step":
                board.add_scalar(f"{group}/{k.removeprefix(group + '_')}", v, step)


# ---- the pre-training run card ------------------------------------------------------------------
def pair_mode(phase) -> str:
    """'nsp' or 'sop' (sentence-order pairs), as `prepare` recorded it."""
    meta = getattr(phase.data, "meta", {}) or {}
    return str((meta.get("config") or {}).get("pair_mode", "nsp"))


def masking_card(phases: list) -> list[dict]:
    """Per phase: the masking as trained, as prepared, and the config keys that changed it."""
    rows = []
    for p in phases:
        prepared = MaskingConfig(**p.data.meta.get("masking_config", {})).to_dict()
        trained = p.collator.cfg.to_dict()
        rows.append({"phase": p.name, "masks": "static (stored with the data)" if p.data.static
                     else "dynamic (new every epoch)", "as_trained": trained, "prepared": prepared,
                     "overridden": {k: {"prepared": prepared.get(k), "trained": v} for k, v in trained.items()
                                    if prepared.get(k) != v}})
    return rows


def pretrain_card(run: Run, world, stop_reason: str, final_eval: dict | None, command: str,
                  metrics: list[dict]) -> dict[str, Any]:
    """The pre-training run card: what was trained, how, how fast, what it scored, on what machine."""
    cfg, st, model = run.cfg, run.state, run.model
    out = Path(cfg.out)
    # the peak in the precision the matrix multiplies ran in (a bf16 run against an fp32 peak read
    # MFU 1.38 on a CPU whose bf16 GEMMs run 2x fp32)
    peak = gemm_peak(world.device, run.precision) * world.world_size
    achieved = st.flops / max(st.elapsed, 1e-9)
    ph = run.phases
    mc = model.config
    return {
        "name": out.name, "command": command or " ".join(sys.argv),
        "model": f"{cfg.model.preset}: {mc.num_layers} layers, hidden {mc.hidden_size}, {mc.num_heads} heads, "
                 f"FFN {mc.intermediate_size}",
        "parameters": num_parameters(model), "vocab_size": mc.vocab_size,
        "objective": "CLM (next-token prediction)" if cfg.train.objective == "clm"
                     else ("MLM + SOP" if pair_mode(ph[0]) == "sop" else "MLM + NSP") if cfg.train.nsp else "MLM",
        "attention": "causal (left-to-right)" if mc.causal else "bidirectional",
        "normalisation": "pre-LN (+ final LayerNorm)" if mc.norm_position == "pre" else "post-LN (BERT)",
        "positions": "ALiBi (attention falls with distance; no position table)" if mc.position_embedding_type == "alibi"
                     else "learned absolute table (BERT)",
        "sentence_pooling": "mean over the tokens (bertkit only)" if mc.classifier_pooling == "mean"
                            else "[CLS] (BERT)",
        "dropout": f"hidden {mc.hidden_dropout}, attention {mc.attention_dropout}",
        "sequence_lengths": [p.max_len for p in ph],
        "global_batch": ph[0].batch_size * ph[0].grad_accum * world.world_size,
        "updates": st.step, "tokens_seen": st.tokens, "skipped_updates": st.skipped,
        "planned_updates": st.planned_steps or None,
        "reproduce": reproduce_line(command, cfg, st),
        "choices_changed": [f"update {u}: {k} {a} -> {b}" for u, k, a, b in st.changes] or None,
        "optimizer": cfg.optim.optimizer, "peak_lr": cfg.optim.lr, "schedule": cfg.optim.schedule,
        "precision": dtype_name(run.precision), "precision_reason": run.precision_reason,
        "packed": run.packed, "packed_reason": run.packed_reason,
        "attention_kernel": run.attention_kernel, "attention_kernel_reason": run.attention_kernel_reason,
        "deterministic": run.deterministic, "world_size": world.world_size, "wall_time_s": round(st.elapsed, 1),
        "tokens_per_s": st.tokens / max(st.elapsed, 1e-9), "train_flops": st.flops,
        "achieved_flops_per_s": achieved, "gemm_peak_flops_per_s": peak, "mfu": achieved / peak if peak else None,
        "stop_reason": stop_reason, "data": [p.path for p in ph], "seed": cfg.train.seed,
        "masking": masking_card(ph), "held_out": ph[0].held_out.report,
        "final_eval": final_eval, "final_train": metrics[-1] if metrics else None,
        "hardware": machine_facts(), "config": to_dict(cfg),
        "flop_model": "per step 3 x (2 x matmul weights x tokens + 4 T^2 C L per sequence + MLM head on masked "
                      "tokens + NSP head); MFU against the best fp32 (CPU) / run-precision (GPU) GEMM measured now",
    }


def reproduce_line(command: str, cfg, st) -> str | None:
    """For a run whose length a time budget decided: the command that repeats it exactly (the
    number of updates it came to, no budget). None for a run bounded by max_steps."""
    if not (cfg.train.budget and st.planned_steps):
        return None
    steps = min(cfg.train.max_steps, st.planned_steps)
    if command.startswith("bertkit quickstart"):
        return re.sub(r" --minutes \S+", "", command) + f" --updates {steps}"
    return f"{command or 'bertkit pretrain CONFIG'} --train.max_steps={steps} --train.budget=null"


def write_run_card(out: str | Path, card: dict[str, Any]) -> tuple[Path, Path]:
    """run_card.json (everything) and run_card.md (the reproduction checklist, human-readable)."""
    out = Path(out)
    jpath, mpath = out / "run_card.json", out / "run_card.md"
    jpath.write_text(json.dumps(card, indent=2, default=str) + "\n", encoding="utf-8")
    lines = [f"# Run card: {card.get('name', out.name)}", "",
             f"Command: `{card.get('command', '')}`", "",
             "| item | value |", "|---|---|"]
    for key in ("model", "parameters", "vocab_size", "objective", "attention", "normalisation", "positions",
                "sentence_pooling", "dropout", "sequence_lengths", "global_batch", "updates", "planned_updates",
                "reproduce", "choices_changed", "tokens_seen",
                "optimizer", "peak_lr", "schedule",
                "precision", "precision_reason", "packed", "packed_reason", "attention_kernel",
                "attention_kernel_reason", "deterministic", "world_size",
                "wall_time_s", "tokens_per_s", "train_flops", "achieved_flops_per_s", "gemm_peak_flops_per_s",
                "mfu", "stop_reason", "data", "seed"):
        if key in card:
            lines.append(f"| {key} | {_fmt(card[key])} |")
    lines += _masking_lines(card)
    for key, title, name in (("final_eval", "Held-out evaluation (final)", "metric"),
                             ("final_train", "Last logged training step", "metric"), ("hardware", "Hardware", "item")):
        if card.get(key):
            lines += md_section(title, card[key], name)
    lines += ["", "Files: `config.yaml` (resolved config), `metrics.jsonl`, `eval.jsonl`, `curves.png`, "
              "`checkpoints/`, `final/` (Hugging Face format)."]
    mpath.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return mpath, jpath


def md_section(title: str, rows, name: str = "metric") -> list[str]:
    """A run card's `## title` section: a table of `rows` (a dict or (name, value) pairs)."""
    rows = rows.items() if isinstance(rows, dict) else rows
    return ["", f"## {title}", "", f"| {name} | value |", "|---|---|", *(f"| {k} | {_fmt(v)} |" for k, v in rows)]


def _masking_lines(card: dict) -> list[str]:
    """Masking as trained (and what the config changed from the prepared data), and the held-out
    set with its measured 12-gram overlap with the training data."""
    lines = []
    for m in card.get("masking") or []:
        t = m["as_trained"]
        what = ("none (next-token objective)" if str(card.get("objective", "")).startswith("CLM") else
                f"{t['mode']}, {t['mask_prob']:.0%} of tokens (at most {t['max_predictions']} per sequence), "
                f"{t['mask_token_fraction']:.0%} [MASK] / {t['random_token_fraction']:.0%} random / "
                f"{1 - t['mask_token_fraction'] - t['random_token_fraction']:.0%} kept; {m['masks']}")
        changed = ", ".join(f"{k} {v['prepared']} -> {v['trained']}" for k, v in m["overridden"].items())
        lines.append(f"| masking ({m['phase']}) | {what}{'; overridden: ' + changed if changed else ''} |")
    h = card.get("held_out") or {}
    if h.get("source"):
        share = f"; {h['overlap']:.2%} of its 12-grams occur in training" if h.get("overlap") is not None else ""
        lines.append(f"| held-out set | {h['source']}: {h.get('path', '-')} ({h.get('instances', 0)} instances)"
                     f"{share} |")
    return lines


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"
    if isinstance(v, int) and abs(v) >= 10000:
        return f"{v:,}"
    return str(v)


def plot_curves(metrics: list[dict], evals: list[dict], path: str | Path, card: dict | None = None) -> Path | None:
    """Training loss, MLM accuracy and learning rate against the update, held-out points on top.

    The title says what the curves are of: run name, model, parameters, tokens seen, updates, wall
    time, the machine (CPU model / GPU) and the date, from `card` (the run card; default: the
    run_card.json next to `path`, if there is one)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # optional dependency
        log.warning("matplotlib is not installed: no plot (pip install 'bertkit[plot]')")
        return None
    if not metrics:
        return None
    path = Path(path)
    if card is None and (path.parent / "run_card.json").is_file():
        try:
            card = json.loads((path.parent / "run_card.json").read_text(encoding="utf-8"))
        except ValueError:
            card = None
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    nan = float("nan")
    metrics, evals = ([{k: (nan if v is None else v) for k, v in m.items()} for m in rows] for rows in (metrics, evals))
    steps = [m["step"] for m in metrics]
    held = "o-" if len(evals) <= 40 else "-"
    lm, name = ("next_token", "next-token") if "next_token_loss" in metrics[0] else ("mlm", "MLM")
    with_nsp = any(m.get("nsp_loss") == m.get("nsp_loss") for m in metrics)      # not all NaN: NSP trained
    axes[0].plot(steps, [m["loss"] for m in metrics], label="train loss (MLM + NSP)" if lm == "mlm" and with_nsp
                 else "train loss", lw=1)
    axes[0].plot(steps, [m[f"{lm}_loss"] for m in metrics], label=f"train {name} loss", lw=1)
    if evals:
        axes[0].plot([e["step"] for e in evals], [e[f"eval_{lm}_loss"] for e in evals], held, ms=3,
                     label=f"held-out {name} loss ({len(evals)} points)")
    axes[1].plot(steps, [m[f"{lm}_accuracy"] for m in metrics], label=f"train {name} accuracy", lw=1)
    if any(m.get("nsp_accuracy") == m.get("nsp_accuracy") for m in metrics):
        axes[1].plot(steps, [m["nsp_accuracy"] for m in metrics], label="train NSP accuracy", lw=1)
    if evals:
        axes[1].plot([e["step"] for e in evals], [e[f"eval_{lm}_accuracy"] for e in evals], held, ms=3,
                     label=f"held-out {name} accuracy")
        if any(e.get("eval_nsp_accuracy") == e.get("eval_nsp_accuracy") for e in evals):
            axes[1].plot([e["step"] for e in evals], [e["eval_nsp_accuracy"] for e in evals], held, ms=3,
                         label="held-out NSP accuracy", alpha=0.6)
    axes[2].plot(steps, [m["lr"] for m in metrics], lw=1)
    for ax, what in zip(axes, ("loss", "accuracy", "learning rate")):
        ax.set(xlabel="update", ylabel=what, title=what)
    for ax in axes[:2]:
        ax.legend(fontsize=8)
    fig.suptitle(plot_title(card or {}, path, metrics), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_title(card: dict, path: Path, metrics: list[dict]) -> str:
    """Two lines: run, model, parameters, tokens, updates, time; machine and date."""
    last = metrics[-1] if metrics else {}
    shown = ((card.get("model"), "{}"), ((card.get("parameters") or 0) / 1e6, "{:.1f} M parameters"),
             (card.get("tokens_seen") or last.get("tokens"), "{:,.0f} tokens"),
             (card.get("updates") or last.get("step"), "{:,} updates"), (card.get("wall_time_s"), "{:.0f} s"))
    parts = [f"run {card.get('name') or path.parent.name}", *(form.format(v) for v, form in shown if v)]
    hw = card.get("hardware") or machine_facts()
    machine = hw.get("gpu") or hw.get("cpu")
    n = hw.get("torch_threads")
    threads = f", {n} thread{'s' * (n != 1)}" if n and not hw.get("gpu") else ""
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return ", ".join(parts) + f"\n{machine}{threads}; {card.get('precision', 'float32')}; {when}"
