"""One arm of the grid: its configs, its pre-training (reused by key, resumed from checkpoints) or the
model of another arm, held-out MLM, the zero-shot measures, its fine-tuning runs or probes, and what
identifies it as finished (`plan_key`, `finished`)."""
from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import os
import shutil
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from ..config import BertConfig, preset
from ..errors import BertkitError, DivergedError
from ..outdir import write_whole
from ..runconfig import AT_LEAST_1, Checked, PretrainConfig, from_dict, merge, save_config
from .config import AblateConfig, Arm, _key, _read_json, _write_json, describe, lr_search_of
from .measure import budget_info, budget_of, choose_lr, collapse_of, heldout_mlm, weights_id
from .shared import Shared
from .zeroshot import arm_blimp, arm_nsp_shortcut

log = logging.getLogger("bertkit")

# ---- one arm --------------------------------------------------------------------------------------
@dataclass
class RunOptions(Checked):
    launcher: Literal["inprocess", "torchrun"] = "inprocess"
    """Pre-train in this process, or as `torchrun --nproc_per_node N -m bertkit pretrain`."""
    nproc: Annotated[int, AT_LEAST_1] = 1
    """Processes per arm with launcher torchrun (e.g. GPUs); train.batch_size is split over them, so the
    global batch and the matched budget stay the same."""
    command: str = ""
    verbose: bool = False
    """Show every run's log on the console (always written to OUT/arms/NAME/log.txt)."""
    pretrain_only: bool = False
    """Pre-train and score each arm (held-out MLM, BLiMP, NSP shortcut) without fine-tuning: status
    'pretrained'; probe arms still run their probes. A later run without it fine-tunes on the same
    pre-training (reused by its key)."""


def arm_budget(cfg: AblateConfig, arm: Arm) -> dict:
    """The pretrain keys of the arm's budget: a number of updates (tokens or FLOPs matched: computed,
    `measure.budget_of`) or a wall time."""
    b = budget_of(cfg, arm)
    return {"train": {"max_steps": 10 ** 9, "budget": str(b["time"])}} if b["match"] == "time" else \
        {"train": {"max_steps": int(b["steps"]), "budget": None}}


def pretrain_config(cfg: AblateConfig, arm: Arm, train: Path, heldout: Path, out: Path):
    """The arm's PretrainConfig: base sections, the arm's, the budget, the shared data."""
    fixed = {"out": str(out), "data": {"path": str(train), "eval_path": str(heldout)},
             "train": {"progress": False}}
    if cfg.threads:
        fixed["train"]["threads"] = cfg.threads
    d = merge(merge(merge(cfg.pretrain, arm.pretrain), arm_budget(cfg, arm)), fixed)
    if steps := read_steps(cfg, arm):           # checkpoints other arms read: every gcd(steps), all kept
        d["train"].update(checkpoint_every=math.gcd(*steps), keep_checkpoints=10 ** 6)   # removed at the end
    pcfg = from_dict(PretrainConfig, d, f"arm {arm.name} pretrain")
    pcfg.ablate_given = d          # the keys given: what identifies the run (see _given_key)
    return pcfg


def read_steps(cfg: AblateConfig, arm: Arm) -> list[int]:
    """The updates at which other arms read this arm's pre-training (their `checkpoint`)."""
    return sorted({a.checkpoint for a in cfg.arms if a.model_from == arm.name and a.checkpoint and not a.error})


def finetune_config(cfg: AblateConfig, arm: Arm, task: str, seed: int, model: Path, out: Path, init: str,
                    lr: float | None = None):
    """The FinetuneConfig of one run: the grid's finetune keys, the task's, the arm's; `lr`: a candidate
    rate of the learning-rate search (over them all)."""
    from ..finetune import FinetuneConfig

    spec = dict(cfg.tasks[task] or {})
    data = spec.pop("data", None)
    d = merge(merge(cfg.finetune, spec), arm.finetune)
    d.update(task=spec.get("task", task), model=str(model), out=str(out), seed=int(seed), progress=False,
             init=init)
    if lr is not None:
        d["lr"] = float(lr)
    if data is not None:
        d["data"] = str(Path(cfg.data_dir) / data)                # an absolute path stays as it is
    if cfg.threads:
        d["threads"] = cfg.threads
    fcfg = from_dict(FinetuneConfig, d, f"arm {arm.name} finetune {task}")
    fcfg.ablate_given = d
    return fcfg


def _given_key(config, **more) -> str:
    """A run's identity: the keys the grid gave it (not the resolved config, so a later version that adds
    a field with its default keeps finished runs), without those that change no number."""
    given = copy.deepcopy(config.ablate_given)
    for k in ("out", "progress", "threads", "resume"):
        given.pop(k, None)
    for k in ("progress", "num_threads", "threads"):
        given.get("train", {}).pop(k, None)
    return _key({"given": given, **more})


def run_arm(cfg: AblateConfig, arm: Arm, shared: Shared, opts: RunOptions) -> dict:
    """Pre-train (or not), score held-out MLM, fine-tune every task x seed; returns arm.json."""
    from ..hardware import cpu_model

    d = Path(cfg.out) / "arms" / arm.name
    state = {"name": arm.name, "setting": describe(arm), "status": "running", "stage": "setup", "error": None,
             "host": socket.gethostname(), "cpu": cpu_model(), "started": _now(), "pid": os.getpid()}
    _write_json(d / "arm.json", state)
    t0, c0 = time.time(), time.process_time()
    handler = _ArmLog(d / "log.txt")
    log.addHandler(handler)
    level = log.level
    if log.getEffectiveLevel() > logging.INFO:       # library use without logging set up: log.txt still gets INFO
        log.setLevel(logging.INFO)
    try:
        if arm.error:
            raise BertkitError(arm.error)
        state["stage"] = "pretrain"
        state["budget"] = budget_info(cfg, arm)
        model, init, pre = _model_of_arm(cfg, arm, shared, opts, d)
        state.update(pretrain=pre, model=str(model), init=init, weights=weights_id(model))
        state["stage"] = "held-out MLM"
        source = _read_json(Path(cfg.out) / "arms" / arm.model_from / "arm.json") if arm.model_from else None
        same_model = source and "mlm" in source and not arm.checkpoint      # a probe reads the source's model
        state["mlm"] = source["mlm"] if same_model else heldout_mlm(cfg, shared, model, d)
        if cfg.blimp and not same_model:              # the source's model is scored in the source's row
            state["stage"] = "BLiMP"
            _write_json(d / "arm.json", state)
            state["blimp"] = arm_blimp(cfg, model, d)
        if init == "pretrained" and not arm.model_from:
            state["stage"] = "NSP shortcut"
            state["nsp_shortcut"] = arm_nsp_shortcut(cfg, shared, model, d)
        if opts.pretrain_only and not arm.probe:      # probes are cheap and measure the representation: run
            state.update(status="pretrained", stage=None, plan=plan_key(cfg, arm))
            return state
        rows = [r for task in cfg.tasks for r in _finetune_task(cfg, arm, task, model, init, d, pre, state)]
        mlm = state["mlm"] or {}
        _write_rows(d / "results.jsonl", [{**r, "mlm_accuracy": mlm.get("accuracy"),
                                           "mlm_accuracy_mask": mlm.get("accuracy_mask")} for r in rows])
        state.update(status="done", stage=None, plan=plan_key(cfg, arm))
    except KeyboardInterrupt:
        state.update(status="interrupted", error="interrupted")
        raise
    except Exception as e:  # noqa: BLE001 - any failure is this arm's row; the grid goes on
        state.update(status="failed", error=one_line(e))
        (d / "error.txt").write_text(traceback.format_exc(), encoding="utf-8")
        log.error("ablate: arm %s failed at %s: %s", arm.name, state["stage"], state["error"])
    finally:
        state.update(wall_s=round(time.time() - t0, 1), cpu_s=round(time.process_time() - c0, 1), finished=_now(),
                     warnings=handler.warnings)
        _write_json(d / "arm.json", state)
        log.removeHandler(handler)
        log.setLevel(level)
        handler.close()
    return state


def finished(cfg: AblateConfig, arm: Arm, pretrain_only: bool = False) -> bool:
    """Done with the current plan, on the model that is there now (a probe arm's source may have been
    redone); with pretrain_only, an arm pre-trained and scored under the current plan counts too."""
    info = _read_json(Path(cfg.out) / "arms" / arm.name / "arm.json") or {}
    ok = ("done", "pretrained") if pretrain_only else ("done",)
    if info.get("status") not in ok or info.get("plan") != plan_key(cfg, arm):
        return False
    return arm.model_from is None or weights_id(Path(info.get("model", ""))) == info.get("weights")


def plan_key(cfg: AblateConfig, arm: Arm) -> str:
    """Everything that decides an arm's numbers (a finished arm with another plan is rerun). Fields at
    their defaults are left out, so a later version that adds an arm field keeps finished arms; the
    `setting` text is a label, so rewording it reruns nothing."""
    return _key(_plan(cfg, arm))


def _plan(cfg: AblateConfig, arm: Arm) -> dict:
    return {"arm": _given(arm), "base": [cfg.corpus, cfg.eval_documents, cfg.split_seed,
            cfg.tokenizer, cfg.prepare, cfg.pretrain, cfg.finetune, cfg.tasks, cfg.seeds,
            dataclasses.asdict(cfg.budget), cfg.mlm_eval_instances]
            + ([cfg.blimp] if cfg.blimp else []),
            "source": [_given(a) for a in cfg.arms if a.name == arm.model_from],
            **_protocol_plan(cfg, arm), **_probe_plan(arm)}


def _probe_plan(arm: Arm) -> dict:
    """A probe arm's results version (`probes.RESULTS_VERSION`): probe arms finished before their
    results kept per-example outcomes are redone (only their probes run again), other arms keep their keys."""
    if not arm.probe:
        return {}
    from .probes import RESULTS_VERSION

    return {"probe_results": RESULTS_VERSION}


def _protocol_plan(cfg: AblateConfig, arm: Arm) -> dict:
    """What an lr search and a FLOPs budget add to the plan, only where used (a grid without them keeps
    its finished arms): the arm's search, and the updates computed to match the base arm's FLOPs
    (they change with the base arm's settings too)."""
    out: dict = {}
    if search := lr_search_of(cfg, arm):
        out["lr_search"] = search
    if "flops" in (cfg.budget.match, arm.budget.get("match")):
        try:
            out["steps"] = budget_of(cfg, arm)["steps"]
        except (BertkitError, ValueError):
            out["steps"] = None
    return out


def _given(arm: Arm) -> dict:
    defaults = Arm(name=arm.name)
    return {k: v for k, v in dataclasses.asdict(arm).items()
            if (v != getattr(defaults, k) or k == "name") and k != "setting"}


def one_line(e: BaseException) -> str:
    msg = " ".join(str(e).split()) or type(e).__name__
    return msg if isinstance(e, BertkitError) else f"{type(e).__name__}: {msg}"


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z")


class _ArmLog(logging.FileHandler):
    """The arm's log.txt (everything at INFO and above), counting the warnings."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        super().__init__(path, encoding="utf-8")
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        self.setLevel(logging.INFO)
        self.warnings = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.warnings += record.levelno == logging.WARNING
        super().emit(record)


def _model_of_arm(cfg: AblateConfig, arm: Arm, shared: Shared, opts: RunOptions, d: Path
                  ) -> tuple[Path, str, dict]:
    """(model folder for fine-tuning, 'pretrained' or 'random', pre-training summary)."""
    if arm.model_from is not None:
        info = _read_json(Path(cfg.out) / "arms" / arm.model_from / "arm.json") or {}
        model = Path(info.get("model") or "")
        if not info.get("pretrain") or not (model / "config.json").is_file():
            raise BertkitError(f"arm {arm.model_from} has no finished model yet (run it first, or on the "
                               f"machine that holds it: --arms {arm.model_from},{arm.name})")
        pre = {**info["pretrain"], "model_from": arm.model_from}
        if arm.checkpoint:
            model = model.parent / f"at-step-{arm.checkpoint}"
            at = _read_json(model / "ablate_step.json")
            if not at:
                raise BertkitError(f"arm {arm.model_from} kept no model at update {arm.checkpoint}")
            pre.update(at, checkpoint=arm.checkpoint)
        return model, info["init"], pre
    train, heldout, data = shared.prepared(merge(cfg.prepare, arm.prepare), float(arm.corpus_fraction))
    pcfg = pretrain_config(cfg, arm, train, heldout, d / "pretrain")
    if not arm.pretrained:
        return _random_model(pcfg, shared, d / "model"), "random", {"tokens": 0, "updates": 0, "wall_s": 0.0,
                                                                    "data_tokens": data["train_tokens"]}
    return d / "pretrain" / "final", "pretrained", _pretrain(cfg, arm, pcfg, opts, d, data)


def _stopped_by_signal(card: dict | None) -> bool:
    """Whether a pre-training's run card says a signal (SIGTERM, Ctrl-C) stopped it before its budget."""
    return str((card or {}).get("stop_reason", "")).startswith("signal")


def _pretrain(cfg: AblateConfig, arm: Arm, pcfg, opts: RunOptions, d: Path, data: dict) -> dict:
    out = Path(pcfg.out)
    key = _given_key(pcfg, data=data["key"])      # the launcher changes no number: not in the key
    card = _read_json(out / "run_card.json")
    old_key = (_read_json(out / "ablate_key.json") or {}).get("key")
    same = old_key == key
    # a run stopped by a signal (SIGTERM, Ctrl-C) also writes its card and final/: it resumes, it is not done
    finished = bool(card) and (out / "final" / "config.json").is_file() and not _stopped_by_signal(card)
    if finished and same:
        log.info("ablate: arm %s: pre-training finished before; reusing %s", arm.name, out / "final")
    else:
        if finished and old_key is None:
            raise BertkitError(f"{out}: a pre-training this grid did not make; move it away to pre-train "
                               "this arm here")
        if finished:                                     # the grid's own run, of settings the arm no longer has
            kept = out.with_name(f"pretrain.replaced-{old_key[:8]}")
            shutil.rmtree(kept, ignore_errors=True)
            out.rename(kept)
            log.warning("ablate: arm %s: its settings changed; the earlier pre-training is kept in %s and "
                        "the arm is pre-trained again", arm.name, kept)
        if not same:                                     # an unfinished run of other settings: start afresh
            shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True, exist_ok=True)
        _write_json(out / "ablate_key.json", {"key": key})
        pcfg.resume = (out / "checkpoints").is_dir()     # an interrupted run continues
        log.info("ablate: arm %s: pre-training (%s)", arm.name, _budget_text(pcfg))
        if opts.launcher == "torchrun":
            t = pcfg.train                     # the same global batch (and budget) as one process
            if t.batch_size % opts.nproc:
                raise BertkitError(f"train.batch_size {t.batch_size} does not split over --nproc {opts.nproc} "
                                   "processes; the global batch must stay the arm's")
            t.batch_size //= opts.nproc
            save_config(pcfg, d / "pretrain.yaml")
            _torchrun(d / "pretrain.yaml", opts.nproc, d / "pretrain.log")
            card = _read_json(out / "run_card.json")
        else:
            from ..train import pretrain
            c0 = time.process_time()
            card = pretrain(pcfg, command=f"{opts.command}  # arm {arm.name}")
            _write_json(out / "ablate_key.json", {"key": key, "cpu_s": round(time.process_time() - c0, 1)})
        if not card:
            raise BertkitError(f"{out}: pre-training ended without a run card")
        if _stopped_by_signal(card):
            # the trainer saved a checkpoint and returned: the arm is interrupted (a rerun resumes it),
            # never scored or fine-tuned as if its budget were spent
            log.warning("ablate: arm %s: pre-training stopped by a %s at update %s of its budget; the arm is "
                        "interrupted (rerun to resume)", arm.name, card["stop_reason"], card.get("updates"))
            raise KeyboardInterrupt
        _keep_steps(out, read_steps(cfg, arm))
        if not cfg.keep_models:
            shutil.rmtree(out / "checkpoints", ignore_errors=True)   # final/ (and at-step-K/) are the models
    ev = card.get("final_eval") or {}
    return {"tokens": card.get("tokens_seen"), "updates": card.get("updates"), "wall_s": card.get("wall_time_s"),
            "global_batch": card.get("global_batch"), "sequence_lengths": card.get("sequence_lengths"),
            "objective": card.get("objective"), "stop_reason": card.get("stop_reason"),
            "parameters": card.get("parameters"), "model": card.get("model"), "data_tokens": data["train_tokens"],
            "precision": card.get("precision"), "own_eval": {k: v for k, v in ev.items() if k != "step"},
            "cpu_s": (_read_json(out / "ablate_key.json") or {}).get("cpu_s"),
            "run_card": str(out / "run_card.md")}


def _keep_steps(out: Path, steps: list[int]) -> None:
    """Copy the model of each checkpoint other arms read to OUT/at-step-K/ (with its tokens and time)."""
    for k in steps:
        src = out / "checkpoints" / f"step-{k:08d}"
        state = (_read_json(src / "trainer.json") or {}).get("state")
        if not (src / "model" / "config.json").is_file() or not state:
            raise BertkitError(f"{out}: no checkpoint at update {k} (did pre-training stop before it?)")
        dst = out / f"at-step-{k}"
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src / "model", dst)
        _write_json(dst / "ablate_step.json", {"tokens": state.get("tokens"), "updates": state.get("step"),
                                               "wall_s": round(state.get("elapsed", 0.0), 1)})


def _budget_text(pcfg) -> str:
    t = pcfg.train
    return f"time budget {t.budget}" if t.budget else (f"{t.max_steps} updates of {t.batch_size} sequences"
                                                        + (f" x {t.grad_accum} accumulated" if t.grad_accum > 1 else ""))


def _torchrun(config: Path, nproc: int, logfile: Path) -> None:
    """`torchrun --nproc_per_node N -m bertkit pretrain CONFIG`; its last error line becomes the row."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "bertkit", "pretrain", str(config)]
    log.info("ablate: %s (log: %s)", " ".join(cmd), logfile)
    with open(logfile, "w", encoding="utf-8") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        lines = [ln for ln in logfile.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
        err = next((ln for ln in reversed(lines) if "error" in ln.lower()), lines[-1] if lines else "")
        raise BertkitError(f"torchrun pre-training exited with {rc}: {err.strip()[:300]}")


def _random_model(pcfg, shared: Shared, out: Path) -> Path:
    """A random initialisation of the arm's shape (fine-tuning with init=random redraws it per seed)."""
    import torch

    from ..checkpoint import build, save_model

    mc = pcfg.model
    names = {f.name for f in dataclasses.fields(BertConfig)}
    extra = {f.name: getattr(mc, f.name) for f in dataclasses.fields(mc)
             if f.name in names and f.name != "vocab_size" and getattr(mc, f.name) is not None}
    tok = shared.tokenizer()
    torch.manual_seed(pcfg.train.seed)
    model = build("pretraining", preset(mc.preset, vocab_size=tok.vocab_size, **extra), nsp=pcfg.train.nsp)
    save_model(model, out)
    tok.save(out)
    return out


def _finetune_task(cfg: AblateConfig, arm: Arm, task: str, model: Path, init: str, d: Path, pre: dict,
                   state: dict) -> list[dict]:
    """One task's rows: every seed at the configured rate, or with an lr search (`lr_search_of`) each
    candidate rate at the first seed (or every seed) first - rows with status 'lr_candidate' - then
    every seed at the rate with the best dev mean (runs already made are reused)."""
    def run(seed: int, lr: float | None = None) -> dict:
        state["stage"] = f"finetune {task} seed {seed}" + (f" lr {lr:g}" if lr is not None else "")
        _write_json(d / "arm.json", state)
        return _finetune_one(cfg, arm, task, seed, model, init, d, pre, lr)

    if arm.probe:                   # logistic-regression probes: deterministic, no seeds (bertkit.linear_probe)
        from .probes import probe_rows
        state["stage"] = f"probe {task}"
        _write_json(d / "arm.json", state)
        fcfg = finetune_config(cfg, arm, task, 0, model, probe_dir(d, task), init)
        return probe_rows(arm, fcfg, pre, weights_id(model), describe(arm))
    search = lr_search_of(cfg, arm)
    if search is None:
        return [run(seed) for seed in cfg.seeds]
    def candidate(seed: int, lr: float) -> dict:
        try:
            return run(seed, lr)
        except DivergedError as e:         # too high a rate for this arm: the search's worst, not the arm's end
            log.warning("ablate: arm %s %s: lr %g diverged at seed %d (%s)", arm.name, task, lr, seed, one_line(e))
            return {"arm": arm.name, "setting": describe(arm), "task": task, "seed": seed, "lr": lr, "value": None,
                    "init": init, "diverged": one_line(e), "status": "ok"}

    on = cfg.seeds if search["seeds"] == "all" else cfg.seeds[:1]
    tried = {lr: {seed: candidate(seed, lr) for seed in on} for lr in search["lrs"]}
    best, means = choose_lr({lr: [r["value"] for r in rows.values()] for lr, rows in tried.items()})
    if all("diverged" in r for rows in tried.values() for r in rows.values()):
        raise DivergedError(f"{task}: every candidate rate diverged ({', '.join(f'{lr:g}' for lr in means)})")
    log.info("ablate: arm %s %s: lr %g chosen on dev (%s)", arm.name, task, best,
             ", ".join(f"{lr:g}: " + ("—" if m is None else f"{m:.4f}") for lr, m in means.items()))
    state.setdefault("lr_chosen", {})[task] = best
    candidates = [{**r, "status": "lr_candidate", "chosen": lr == best} for lr, rows in tried.items()
                  for r in rows.values()]
    rows = [tried[best].get(seed) or run(seed, best) for seed in cfg.seeds]
    scores = {f"{lr:g}": m for lr, m in means.items()}
    return candidates + [{**r, "lr_candidates": scores, "lr_chosen_on": on} for r in rows]


def finetune_dir(arm_dir: Path, task: str, seed: int, lr: float | None = None) -> Path:
    """Where a fine-tuning run of the arm is: finetune/TASK/seedS, or finetune/TASK/lrR/seedS for a
    candidate rate of an lr search (arm.json's `lr_chosen` names the reported one)."""
    return arm_dir / "finetune" / task / (f"lr{lr:g}" if lr is not None else "") / f"seed{seed}"


def probe_dir(arm_dir: Path, task: str) -> Path:
    """Where a probe arm's probes of a task are: probe/TASK (results.json with each probe's dev outcomes)."""
    return arm_dir / "probe" / task


def _finetune_one(cfg: AblateConfig, arm: Arm, task: str, seed: int, model: Path, init: str, d: Path,
                  pre: dict, lr: float | None = None) -> dict:
    from ..finetune import finetune

    out = finetune_dir(d, task, seed, lr)
    fcfg = finetune_config(cfg, arm, task, seed, model, out, init, lr)
    key = _given_key(fcfg, model=str(model), weights=weights_id(model))
    result = _read_json(out / "metrics.json")
    if not (result and (_read_json(out / "ablate_key.json") or {}).get("key") == key):
        log.info("ablate: arm %s: fine-tuning %s, seed %d", arm.name, task, seed)
        shutil.rmtree(out, ignore_errors=True)
        c0 = time.process_time()
        result = finetune(fcfg, command=f"bertkit ablate {cfg.source}  # arm {arm.name} {task} seed {seed}")
        _write_json(out / "ablate_key.json", {"key": key, "cpu_s": round(time.process_time() - c0, 1)})
        if not cfg.keep_models:
            for p in out.glob("*.safetensors"):
                p.unlink()
    metric = result["main_metric"]
    history = [h for h in result.get("history") or [] if f"dev_{metric}" in h]
    last = history[-1][f"dev_{metric}"] if history else (result.get("dev") or {}).get(metric)
    log.info("ablate: arm %s %s seed %d: dev %s %.4f (last epoch), %.4f (best)", arm.name, task, seed, metric,
             last if last is not None else float("nan"), (result.get("dev") or {}).get(metric, float("nan")))
    return {"arm": arm.name, "setting": describe(arm), "task": task, "seed": seed, "metric": metric,
            "value": last, "best": (result.get("dev") or {}).get(metric), "init": init,
            "frozen": bool(getattr(fcfg, "freeze", False)), "finetune_wall_s": result.get("wall_time_s"),
            "finetune_cpu_s": (_read_json(out / "ablate_key.json") or {}).get("cpu_s"),
            "train_examples": result.get("train_examples"), "dev_examples": result.get("dev_examples"),
            "pretrain_tokens": pre.get("tokens"), "pretrain_updates": pre.get("updates"),
            "pretrain_wall_s": pre.get("wall_s"), "run_card": str(out / "run_card.md"), "lr": fcfg.lr,
            **collapse_of(result), "status": "ok"}


def _write_rows(path: Path, rows: list[dict]) -> None:
    write_whole(path, "".join(json.dumps(r, default=str) + "\n" for r in rows))
