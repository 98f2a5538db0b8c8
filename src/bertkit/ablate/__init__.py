"""`bertkit ablate CONFIG.yaml`: which ingredients carry BERT's result, measured on your machine.

A grid of arms, each differing from a base recipe in one setting, under a matched budget, with the
same tokenizer and the same text. Each arm pre-trains (or not), is scored on held-out documents with
one fixed MLM protocol, and is fine-tuned on every task with several seeds. Then a table.

    OUT/shared/corpus/      train.txt + heldout.txt: a document-level split made once (same for all arms)
    OUT/shared/tokenizer/   one WordPiece vocabulary, trained once on train.txt
    OUT/shared/data/KEY/    prepared data, once per distinct prepare setting (train/ + heldout/)
    OUT/arms/NAME/          arm.json (status, one-line error, budget, lr chosen), log.txt, pretrain/ (its
                            run card), finetune/TASK/seedS/ (run cards, metrics; TASK/lrR/seedS/ with
                            an lr search), results.jsonl
    OUT/results.jsonl       one row per arm x task x seed, collected from the arms
    OUT/REPORT.md, OUT/plots/*.png

Honest by construction:
  * resumable: a finished arm (arm.json status 'done' with the same settings, on the same model) is
    skipped; inside an arm, a finished pre-training or fine-tuning run given the same keys is reused,
    and an interrupted pre-training resumes from its checkpoint, so a stopped grid loses little.
    Settings that changed under a finished pre-training run are refused (delete the folder to redo
    it), never silently mixed.
  * a failing arm is a row saying so (the error on one line; the traceback in arms/NAME/error.txt)
    and the grid goes on; `bertkit ablate` then exits 1 naming the failed arms. A mistake that would
    fail every arm (a grid key, the base settings, a missing corpus or task folder) stops the grid
    before anything is written.
  * split across machines: `--arms a,b` or `--shard I/N` (arms reusing another arm's model go with
    it), all writing into one shared OUT; shared files are written to a temporary name and renamed,
    so two machines at worst do the same work twice. Any machine can write the report
    (`--report-only`): it collects whatever is finished.
  * `--jobs N` runs N arms at once on one machine (each process claims the next arm atomically).
  * `--launcher torchrun --nproc N` pre-trains each arm as `torchrun -m bertkit pretrain` (GPUs), with
    train.batch_size split over the processes so the global batch (and the budget) stays the same.

The grid's configuration (AblateConfig, arms, selection) is `bertkit.ablate_config`; what is measured
and how arms are matched (held-out MLM at [MASK], FLOP-matched budgets, the learning rate chosen on dev,
collapsed seeds) is `bertkit.ablate_measure`; the statistics and the report (Welch's interval against
the base arm over the fine-tuning seeds) are `bertkit.ablate_report`. This file is longer than the
style guide's ~600 lines (~1000) on purpose:
the caches, one arm's procedure and the processes that share a grid are one mechanism whose
invariants (what identifies a finished run, who may write where) must be read together; it is laid
out in blocks of plain functions: shared inputs, one arm, the grid (claims, jobs), the paper note's
contract test.
"""
from __future__ import annotations

import copy
import dataclasses
import gzip
import hashlib
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
from typing import Literal, Sequence

from .ablate_config import (
    AblateConfig,
    Arm,
    _key,
    _read_json,
    _write_json,
    describe,
    flatten,
    lr_search_of,
    merge)
from .ablate_measure import budget_info, budget_of, choose_lr, collapse_of, heldout_mlm, weights_id
from .ablate_zeroshot import arm_blimp, arm_nsp_shortcut
from .errors import BertkitError

log = logging.getLogger("bertkit")


# ---- shared inputs: split, tokenizer, prepared data ---------------------------------------------
class Shared:
    """The grid's shared inputs, made on first use and cached in OUT/shared (atomic renames)."""

    def __init__(self, cfg: AblateConfig):
        self.cfg = cfg
        self.root = Path(cfg.out) / "shared"
        self.data_dir = Path(cfg.data_dir)
        self._tokenizer = None
        self._split: dict | None = None

    def split(self) -> dict:
        """Training and held-out documents (held out: the eval_documents with the smallest seeded
        hash of their text, so the choice does not depend on file order)."""
        if self._split is not None:
            return self._split
        d = self.root / "corpus"
        files = [self._path(f) for f in self.cfg.corpus]
        key = _key({"files": [(str(f), f.stat().st_size) for f in files], "eval": self.cfg.eval_documents,
                    "seed": self.cfg.split_seed})
        info = _read_json(d / "split.json")
        if not (info and info.get("key") == key):
            docs = [doc for f in files for doc in read_documents(f)]
            if len(docs) < self.cfg.eval_documents + 2:
                raise BertkitError(f"corpus: {len(docs)} documents, fewer than eval_documents + 2")
            ranked = sorted(range(len(docs)), key=lambda i: doc_hash(docs[i], self.cfg.split_seed))
            held = set(ranked[:self.cfg.eval_documents])
            tmp = self.root / f".corpus.{os.getpid()}.tmp"
            tmp.mkdir(parents=True, exist_ok=True)
            train = [doc for i, doc in enumerate(docs) if i not in held]
            _write_docs(tmp / "train.txt", train)
            _write_docs(tmp / "heldout.txt", [docs[i] for i in sorted(held)])
            info = {"key": key, "files": [str(f) for f in files], "documents": len(docs),
                    "train_documents": len(train), "heldout_documents": len(held)}
            _write_json(tmp / "split.json", info)
            _install(tmp, d, key, "split.json")
            info = _read_json(d / "split.json")
        self._split = info
        return info

    def train_text(self, fraction: float) -> Path:
        """train.txt, or a nested random subset of its documents (fraction < 1)."""
        self.split()
        full = self.root / "corpus" / "train.txt"
        if fraction >= 1:
            return full
        path = self.root / "corpus" / f"train-{fraction:g}.txt"
        if not path.is_file():
            docs = [d for d in read_documents(full) if _unit(doc_hash(d, self.cfg.split_seed + 1)) < fraction]
            if len(docs) < 2:
                raise BertkitError(f"corpus_fraction {fraction:g} leaves {len(docs)} documents")
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            _write_docs(tmp, docs)
            tmp.replace(path)
        return path

    def tokenizer(self):
        from .tokenizer import Tokenizer

        if self._tokenizer is not None:
            return self._tokenizer
        split = self.split()
        d = self.root / "tokenizer"
        opts = {"vocab_size": 8000, **self.cfg.tokenizer}
        key = _key({"split": split["key"], **opts})
        if (_read_json(d / "ablate_key.json") or {}).get("key") != key:
            log.info("ablate: training the shared WordPiece vocabulary (%s) on %d documents", opts,
                     split["train_documents"])
            try:
                tok = Tokenizer.train([str(self.root / "corpus" / "train.txt")], **opts)
            except TypeError as e:
                raise BertkitError(f"{self.cfg.source}: tokenizer: {e}") from None
            tmp = self.root / f".tokenizer.{os.getpid()}.tmp"
            tok.save(tmp)
            _write_json(tmp / "ablate_key.json", {"key": key, **opts})
            _install(tmp, d, key)
        self._tokenizer = Tokenizer.from_dir(d)       # whoever renamed first, everyone uses that one
        return self._tokenizer

    def prepared(self, prepare: dict, fraction: float = 1.0) -> tuple[Path, Path, dict]:
        """(train data, held-out data, key info) prepared with these PrepareConfig keys."""
        from .data.prepare import PrepareConfig, prepare as run_prepare
        from .runconfig import from_dict

        tok = self.tokenizer()
        names = {f.name for f in dataclasses.fields(PrepareConfig)}
        opts = dict(prepare)
        for k in ("eval_documents",):            # the grid holds out its own documents (see split)
            if k in names:
                opts[k] = 0
        pcfg = from_dict(PrepareConfig, opts, "prepare")
        info = {"prepare": pcfg.to_dict(), "fraction": fraction, "split": self.split()["key"],
                "tokenizer": tok.fingerprint()}
        key = _key(info)
        d = self.root / "data" / key
        if (_read_json(d / "ablate_key.json") or {}).get("key") != key:
            log.info("ablate: preparing data %s (%s)", key, _short(prepare) or "the base settings")
            tmp = self.root / "data" / f".{key}.{os.getpid()}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            text = self.train_text(fraction)
            meta = run_prepare([str(text)], tok, tmp / "train", pcfg, progress=False, command="bertkit ablate")
            held = run_prepare([str(self.root / "corpus" / "heldout.txt")], tok, tmp / "heldout", pcfg,
                               progress=False, command="bertkit ablate")
            _write_json(tmp / "ablate_key.json", {"key": key, **info, "train_tokens": meta["counts"]["tokens"],
                                                  "train_instances": meta["counts"]["instances"],
                                                  "heldout_instances": held["counts"]["instances"]})
            _install(tmp, d, key)
        return d / "train", d / "heldout", _read_json(d / "ablate_key.json")

    def _path(self, name: str) -> Path:
        p = Path(name)
        p = p if p.is_absolute() else self.data_dir / p
        if not p.exists():
            raise BertkitError(f"{self.cfg.source}: {p}: no such file (data_dir {self.cfg.data_dir}; "
                               f"set data_dir in the config or --data-dir)")
        return p


def _short(d: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in flatten(d).items())


def _install(tmp: Path, final: Path, key: str, marker: str = "ablate_key.json") -> None:
    """Rename a finished folder into place. If another process installed the same thing meanwhile,
    keep theirs (it may be in use); a stale entry (another key) is replaced."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if (_read_json(final / marker) or {}).get("key") == key:
        shutil.rmtree(tmp, ignore_errors=True)
        return
    if final.exists():
        old = final.with_name(f".{final.name}.old.{os.getpid()}")
        os.replace(final, old)
        shutil.rmtree(old, ignore_errors=True)
    try:
        os.replace(tmp, final)
    except OSError:                                # another process installed it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)


def read_documents(path: Path) -> list[list[str]]:
    """Documents (lists of lines) of a text file, plain or .gz, blank lines between documents."""
    opener = gzip.open if str(path).endswith(".gz") else open
    docs, cur = [], []
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if line:
                cur.append(line)
            elif cur:
                docs.append(cur)
                cur = []
    if cur:
        docs.append(cur)
    return docs


def _write_docs(path: Path, docs: list[list[str]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n\n".join("\n".join(d) for d in docs) + "\n")


def doc_hash(doc: list[str], seed: int) -> int:
    h = hashlib.blake2b("\n".join(doc).encode("utf-8"), digest_size=8, key=f"ablate-{seed}".encode())
    return int.from_bytes(h.digest(), "big")


def _unit(h: int) -> float:
    return h / 2 ** 64


# ---- one arm --------------------------------------------------------------------------------------
@dataclass
class RunOptions:
    launcher: Literal["inprocess", "torchrun"] = "inprocess"
    """'inprocess' or 'torchrun' (pre-training as a subprocess over `nproc` processes)."""
    nproc: int = 1
    command: str = ""
    verbose: bool = False
    """Show every run's log on the console (always written to OUT/arms/NAME/log.txt)."""
    jobs: int | None = None
    """Arms run in this many processes at once on this machine (each takes the next unclaimed arm);
    None = the config's `jobs`."""
    threads: int | None = None
    """Override the config's torch threads per run."""
    pretrain_only: bool = False
    """Pre-train and score each arm (held-out MLM, BLiMP, NSP shortcut) without fine-tuning: status
    'pretrained'; probe arms still run their probes. A later run without it fine-tunes on the same
    pre-training (reused by its key)."""

    def __post_init__(self) -> None:
        from .runconfig import check_ranges

        check_ranges(self, {"nproc": ">=1", "jobs": "opt>=1", "threads": "optthreads"})


class _GridLines(logging.Filter):
    """On the console, only the grid's own lines and errors; each arm's log.txt has everything (the
    grid says how many warnings an arm logged)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or str(record.msg).startswith("ablate:")


def arm_budget(cfg: AblateConfig, arm: Arm) -> dict:
    """The pretrain keys of the arm's budget: a number of updates (tokens or FLOPs matched: computed,
    `ablate_measure.budget_of`) or a wall time."""
    b = budget_of(cfg, arm)
    return {"train": {"max_steps": 10 ** 9, "budget": str(b["time"])}} if b["match"] == "time" else \
        {"train": {"max_steps": int(b["steps"]), "budget": None}}


def pretrain_config(cfg: AblateConfig, arm: Arm, train: Path, heldout: Path, out: Path):
    """The arm's PretrainConfig: base sections, the arm's, the budget, the shared data."""
    from .runconfig import PretrainConfig, from_dict

    fixed = {"out": str(out), "data": {"path": str(train), "eval_path": str(heldout)},
             "train": {"progress": False}}
    if cfg.threads:
        fixed["train"]["threads"] = cfg.threads
    d = merge(merge(merge(cfg.pretrain, arm.pretrain), arm_budget(cfg, arm)), fixed)
    steps = read_steps(cfg, arm)
    if steps:                                   # checkpoints other arms read: every gcd(steps), all kept
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
    from .finetune import FinetuneConfig
    from .runconfig import from_dict

    spec = dict(cfg.tasks[task] or {})
    data = spec.pop("data", None)
    d = merge(merge(cfg.finetune, spec), arm.finetune)
    d.update(task=spec.get("task", task), model=str(model), out=str(out), seed=int(seed), progress=False,
             init=init)
    if lr is not None:
        d["lr"] = float(lr)
    if data is not None:
        d["data"] = str(Path(data) if Path(data).is_absolute() else Path(cfg.data_dir) / data)
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
    from .hardware import cpu_model

    d = Path(cfg.out) / "arms" / arm.name
    state = {"name": arm.name, "setting": describe(arm), "status": "running", "stage": "setup", "error": None,
             "host": socket.gethostname(), "cpu": cpu_model(), "started": _now(), "pid": os.getpid()}
    _write_json(d / "arm.json", state)
    t0, c0 = time.time(), time.process_time()
    handler = _file_log(d / "log.txt")
    logger = logging.getLogger("bertkit")
    level = logger.level
    if logger.getEffectiveLevel() > logging.INFO:    # library use without logging set up: log.txt still gets INFO
        logger.setLevel(logging.INFO)
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
        state["mlm"] = source["mlm"] if same_model else heldout_mlm(cfg, shared, model)
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
        logger.removeHandler(handler)
        logger.setLevel(level)
        handler.close()
    return state


def finished(cfg: AblateConfig, arm: Arm, pretrain_only: bool = False) -> bool:
    """Done with the current plan, on the model that is there now (a probe arm's source may have been
    redone); with pretrain_only, an arm pre-trained and scored under the current plan counts too."""
    info = _read_json(Path(cfg.out) / "arms" / arm.name / "arm.json") or {}
    ok = ("done", "pretrained") if pretrain_only else ("done",)
    if info.get("status") not in ok or info.get("plan") not in (plan_key(cfg, arm),
                                                                _labelled_plan_key(cfg, arm, info.get("setting"))):
        return False
    return arm.model_from is None or weights_id(Path(info.get("model", ""))) == info.get("weights")


def plan_key(cfg: AblateConfig, arm: Arm) -> str:
    """Everything that decides an arm's numbers (a finished arm with another plan is rerun). Fields at
    their defaults are left out, so a later version that adds an arm field keeps finished arms; the
    `setting` text is a label, so rewording it reruns nothing."""
    return _key(_plan(cfg, arm, label=False))


def _labelled_plan_key(cfg: AblateConfig, arm: Arm, setting: str | None) -> str:
    """The plan key of an arm finished before labels were left out, with the label it ran under."""
    return _key(_plan(cfg, dataclasses.replace(arm, setting=setting or ""), label=True))


def _plan(cfg: AblateConfig, arm: Arm, label: bool) -> dict:
    return {"arm": _given(arm, label), "base": [cfg.corpus, cfg.eval_documents, cfg.split_seed,
            cfg.tokenizer, cfg.prepare, cfg.pretrain, cfg.finetune, cfg.tasks, cfg.seeds,
            dataclasses.asdict(cfg.budget), cfg.mlm_eval_instances]
            + ([cfg.blimp] if cfg.blimp else []),
            "source": [_given(a, label) for a in cfg.arms if a.name == arm.model_from],
            **_protocol_plan(cfg, arm)}


def _protocol_plan(cfg: AblateConfig, arm: Arm) -> dict:
    """What an lr search and a FLOPs budget add to the plan, only where used (a grid without them keeps
    its finished arms): the arm's search, and the updates computed to match the base arm's FLOPs
    (they change with the base arm's settings too)."""
    out: dict = {}
    search = lr_search_of(cfg, arm)
    if search:
        out["lr_search"] = search
    if "flops" in (cfg.budget.match, arm.budget.get("match")):
        try:
            out["steps"] = budget_of(cfg, arm)["steps"]
        except (BertkitError, ValueError):
            out["steps"] = None
    return out


def _given(arm: Arm, label: bool = False) -> dict:
    defaults = Arm(name=arm.name)
    return {k: v for k, v in dataclasses.asdict(arm).items()
            if (v != getattr(defaults, k) or k == "name") and (label or k != "setting")}


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


def _file_log(path: Path) -> _ArmLog:
    h = _ArmLog(path)
    logging.getLogger("bertkit").addHandler(h)
    return h


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


def _pretrain(cfg: AblateConfig, arm: Arm, pcfg, opts: RunOptions, d: Path, data: dict) -> dict:
    from .runconfig import save_config

    out = Path(pcfg.out)
    key = _given_key(pcfg, data=data["key"])      # the launcher changes no number: not in the key
    card = _read_json(out / "run_card.json")
    same = (_read_json(out / "ablate_key.json") or {}).get("key") == key
    # a run stopped by a signal (SIGTERM, Ctrl-C) also writes its card and final/: it resumes, it is not done
    stopped = str((card or {}).get("stop_reason", "")).startswith("signal")
    finished = bool(card) and (out / "final" / "config.json").is_file() and not stopped
    if finished and same:
        log.info("ablate: arm %s: pre-training finished before; reusing %s", arm.name, out / "final")
    else:
        old_key = (_read_json(out / "ablate_key.json") or {}).get("key")
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
            from .train import pretrain
            c0 = time.process_time()
            card = pretrain(pcfg, command=f"{opts.command}  # arm {arm.name}")
            _write_json(out / "ablate_key.json", {"key": key, "cpu_s": round(time.process_time() - c0, 1)})
        if not card:
            raise BertkitError(f"{out}: pre-training ended without a run card")
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

    from .checkpoint import build, save_model
    from .config import BertConfig, preset

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
        from .linear_probe import probe_rows
        state["stage"] = f"probe {task}"
        _write_json(d / "arm.json", state)
        fcfg = finetune_config(cfg, arm, task, 0, model, d / "probe" / task, init)
        return probe_rows(arm, fcfg, pre, weights_id(model), describe(arm))
    search = lr_search_of(cfg, arm)
    if search is None:
        return [run(seed) for seed in cfg.seeds]
    on = cfg.seeds if search["seeds"] == "all" else cfg.seeds[:1]
    tried = {lr: {seed: run(seed, lr) for seed in on} for lr in search["lrs"]}
    best, means = choose_lr({lr: [r["value"] for r in rows.values()] for lr, rows in tried.items()})
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


def _finetune_one(cfg: AblateConfig, arm: Arm, task: str, seed: int, model: Path, init: str, d: Path,
                  pre: dict, lr: float | None = None) -> dict:
    from .finetune import finetune

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
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(path)


# ---- the grid -------------------------------------------------------------------------------------
def resolve(cfg: AblateConfig, arm: Arm) -> dict:
    """The arm's configs with placeholder paths (no data made): raises what running the arm would."""
    from .data.prepare import PrepareConfig
    from .runconfig import from_dict, to_dict

    if arm.error:
        raise BertkitError(arm.error)
    prep = to_dict(from_dict(PrepareConfig, merge(cfg.prepare, arm.prepare), f"arm {arm.name} prepare"))
    out = Path(cfg.out) / "arms" / arm.name
    pre = pretrain_config(cfg, arm, out / "<train>", out / "<heldout>", out / "pretrain")
    tasks = {t: to_dict(finetune_config(cfg, arm, t, cfg.seeds[0], out / "<model>", out / "finetune" / t,
                                        "pretrained" if arm.pretrained else "random")) for t in cfg.tasks}
    return {"prepare": prep, "pretrain": to_dict(pre), "finetune": tasks}


def check_base(cfg: AblateConfig) -> dict:
    """The base recipe must resolve: a mistake there would fail every arm, so it stops the grid now."""
    try:
        return resolve(cfg, Arm(name="(base settings)"))
    except (BertkitError, ValueError) as e:
        raise BertkitError(f"{cfg.source}: the base settings do not resolve: {one_line(e)}") from None


def check_inputs(cfg: AblateConfig) -> None:
    """The corpus files and every task's data are there (each arm reads them: one missing would fail
    every arm after minutes of work), before anything is written."""
    shared = Shared(cfg)
    for name in cfg.corpus:
        shared._path(name)
    for task, spec in cfg.tasks.items():
        data = (spec or {}).get("data") if isinstance(spec, dict) else None
        if data is not None and not (Path(data) if Path(data).is_absolute() else Path(cfg.data_dir) / data).exists():
            raise BertkitError(f"{cfg.source}: task {task}: data {data}: no such file or folder in data_dir "
                               f"{cfg.data_dir} (set data_dir in the config or --data-dir)")


def dry_run(cfg: AblateConfig, arms: Sequence[Arm]) -> list[dict]:
    """Per arm: what it changes against the base (resolved keys that differ) or why it would fail."""
    base = check_base(cfg)
    flat_base = {s: flatten(v) for s, v in base.items()}
    rows = []
    for arm in arms:
        row = {"arm": arm.name, "setting": describe(arm), "pretrained": arm.pretrained, "model_from": arm.model_from}
        try:
            r = resolve(cfg, arm)
            row["changes"] = {f"{s}.{k}": v for s, d in r.items() for k, v in flatten(d).items()
                              if flat_base[s].get(k) != v and "<" not in str(v) and not k.endswith(".out")
                              and k != "out" and not k.endswith(".init")}
            row["changes"].update({k: getattr(arm, k) for k in ("corpus_fraction", "checkpoint")
                                   if getattr(arm, k) not in (1.0, 1, None)})
            row.update(budget=budget_info(cfg, arm), finetune=_finetune_plan(cfg, arm, r["finetune"]), status="ok")
        except (BertkitError, ValueError) as e:
            row.update(status="would fail", error=one_line(e))
        rows.append(row)
    return rows


def _finetune_plan(cfg: AblateConfig, arm: Arm, tasks: dict) -> dict:
    """The fine-tuning runs of the arm per task, for --dry-run: the seeds and the rate, or the lr search."""
    search = lr_search_of(cfg, arm)
    if search is None:
        return {"seeds": cfg.seeds, "lr": {t: c.get("lr") for t, c in tasks.items()},
                "runs_per_task": len(cfg.seeds)}
    on = cfg.seeds if search["seeds"] == "all" else cfg.seeds[:1]
    return {"seeds": cfg.seeds, "lr_search": search["lrs"], "lr_chosen_on_seeds": on,
            "runs_per_task": len(search["lrs"]) * len(on) + len(cfg.seeds) - len(on)}


def run_grid(cfg: AblateConfig, arms: Sequence[Arm] | None = None, opts: RunOptions | None = None) -> dict:
    """Run the selected arms (skipping finished ones and arms another process holds); the report over
    everything finished is `ablate_report.write_report`, which `bertkit ablate` calls next. With
    opts.jobs > 1 the arms run in that many processes."""
    opts = opts or RunOptions()
    arms = list(cfg.arms if arms is None else arms)
    if opts.threads is not None:
        cfg.threads = opts.threads
    jobs = cfg.jobs if opts.jobs is None else opts.jobs
    if jobs < 1:
        raise BertkitError(f"jobs must be >= 1, got {jobs}")
    opts = dataclasses.replace(opts, jobs=jobs)
    check_base(cfg)
    check_inputs(cfg)
    shared = Shared(cfg)
    quiet = [] if opts.verbose else [h for h in logging.getLogger().handlers if not isinstance(h, logging.FileHandler)]
    for h in quiet:
        h.addFilter(_QUIET)
    try:
        summary = _run_jobs(cfg, arms, shared, opts) if opts.jobs > 1 else _run_arms(cfg, arms, shared, opts)
    finally:
        for h in quiet:
            h.removeFilter(_QUIET)
    return summary


_QUIET = _GridLines()


def _run_arms(cfg: AblateConfig, arms: list[Arm], shared: Shared, opts: RunOptions) -> dict:
    """Each arm in order; an arm held by another process is left to it, and an arm whose source model
    (model_from) is being trained by another process waits for it."""
    t0, ran, skipped, elsewhere = time.time(), [], [], []
    pending, total = list(arms), len(arms)
    while pending:
        progressed = False
        for arm in list(pending):
            d = Path(cfg.out) / "arms" / arm.name
            if finished(cfg, arm, opts.pretrain_only):
                log.info("ablate: arm %s finished before; skipped", arm.name)
                _add_mask_accuracy(d, cfg, shared)
                skipped.append(arm.name)
            elif arm.model_from and _claimed(Path(cfg.out) / "arms" / arm.model_from):
                continue                                   # its model is still being trained elsewhere
            else:
                claim = _claim(d)
                if claim is None:
                    holder = _read_json(d / ".claim") or {}
                    log.info("ablate: arm %s is running in another process (%s, pid %s); left to it", arm.name,
                             holder.get("host"), holder.get("pid"))
                    elsewhere.append(arm.name)
                else:
                    try:
                        _one_arm(cfg, arm, shared, opts, ran, total - len(pending) + 1, total, t0, len(pending) - 1)
                    finally:
                        claim.unlink(missing_ok=True)
            pending.remove(arm)
            progressed = True
        if pending and not progressed:
            time.sleep(5)
    return {"ran": [s["name"] for s in ran],
            "failed": [s["name"] for s in ran if s["status"] not in ("done", "pretrained")],
            "skipped": skipped, "elsewhere": elsewhere, "wall_s": round(time.time() - t0, 1)}


def _add_mask_accuracy(d: Path, cfg: AblateConfig, shared: Shared) -> None:
    """An arm finished before held-out MLM was scored at [MASK] positions gets that figure now (seconds,
    on the model it holds; nothing else of it changes), so a resumed grid's report has it for every arm."""
    state = _read_json(d / "arm.json") or {}
    model = Path(state.get("model") or "")
    if not isinstance(state.get("mlm"), dict) or "accuracy_mask" in state["mlm"] or not (model / "config.json").is_file():
        return
    try:
        state["mlm"] = heldout_mlm(cfg, shared, model)
    except Exception as e:  # noqa: BLE001 - the arm stays as it was
        log.warning("ablate: arm %s: held-out MLM at [MASK] not added: %s", state.get("name"), one_line(e))
        return
    rows = [json.loads(x) for x in (d / "results.jsonl").read_text(encoding="utf-8").splitlines() if x] \
        if (d / "results.jsonl").is_file() else []
    _write_rows(d / "results.jsonl", [{**r, "mlm_accuracy_mask": state["mlm"]["accuracy_mask"]} for r in rows])
    _write_json(d / "arm.json", state)
    log.info("ablate: arm %s: held-out MLM accuracy at [MASK] %.4f added", state.get("name"),
             state["mlm"]["accuracy_mask"])


def _one_arm(cfg, arm, shared, opts, ran, k, total, t0, left) -> None:
    log.info("ablate: [%d/%d] arm %s: %s", k, total, arm.name, describe(arm))
    t = time.time()
    state = run_arm(cfg, arm, shared, opts)
    ran.append(state)
    mean = (time.time() - t0) / len(ran)
    log.info("ablate: arm %s %s in %.1f min%s; %d arm(s) left, about %.0f min at this pace", arm.name,
             state["status"], (time.time() - t) / 60,
             f" ({state['warnings']} warnings in its log.txt)" if state.get("warnings") else "", left,
             left * mean / max(opts.jobs, 1) / 60)


def _claim(d: Path) -> Path | None:
    """Create d/.claim (host, pid) atomically; None if a live process holds it. A claim left by a dead
    process of this machine is taken over; claims of other machines are honoured (delete the file if
    that run is gone)."""
    d.mkdir(parents=True, exist_ok=True)
    path = d / ".claim"
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if _claimed(d):
                return None
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump({"host": socket.gethostname(), "pid": os.getpid(), "since": _now()}, f)
        return path
    return None


def _claimed(d: Path) -> bool:
    """Whether a live process holds the arm in folder d."""
    holder = _read_json(d / ".claim")
    if not holder:
        return (d / ".claim").exists()            # being written right now
    if holder.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(holder["pid"]), 0)
    except (OSError, ValueError, KeyError):
        return False
    return True


def _run_jobs(cfg: AblateConfig, arms: list[Arm], shared: Shared, opts: RunOptions) -> dict:
    """opts.jobs processes (`bertkit ablate CONFIG --arms ... --jobs 1`) share the arms through claims;
    the shared inputs are made first, here, so the jobs do not make them twice."""
    if not Path(cfg.source).is_file():
        raise BertkitError("--jobs re-reads the grid config: give it as a file")
    t0 = time.time()
    shared.tokenizer()
    for arm in arms:
        if arm.model_from is None and not arm.error:
            try:
                shared.prepared(merge(cfg.prepare, arm.prepare), float(arm.corpus_fraction))
            except (BertkitError, ValueError):
                pass                                   # the arm itself will fail as a row, with this error
    threads = cfg.threads or max(1, (os.cpu_count() or 1) // opts.jobs)
    cmd = [sys.executable, "-m", "bertkit"] + (["-v"] if opts.verbose else []) + [
        "ablate", cfg.source, "--out", cfg.out, "--data-dir", cfg.data_dir, "--no-report", "--jobs", "1",
        "--threads", str(threads), "--arms", ",".join(a.name for a in arms)] + (
        ["--pretrain-only"] if opts.pretrain_only else [])
    log.info("ablate: %d jobs of %d thread(s) each over %d arms", opts.jobs, threads, len(arms))
    procs = [subprocess.Popen(cmd, env={**os.environ, "BERTKIT_ABLATE_JOB": str(j)}) for j in range(opts.jobs)]
    try:
        codes = [p.wait() for p in procs]
    except KeyboardInterrupt:                      # the jobs got the Ctrl-C too: let them record it
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.terminate()
        raise
    states = [_read_json(Path(cfg.out) / "arms" / a.name / "arm.json") or {} for a in arms]
    return {"jobs": opts.jobs, "exit_codes": codes,
            "done": [s.get("name") for s in states if s.get("status") in ("done", "pretrained")],
            "failed": [s.get("name") for s in states if s.get("status") in ("failed", "interrupted")],
            "wall_s": round(time.time() - t0, 1)}


# ---- the paper note's minimal implementation test --------------------------------------------------
def contract_test(model: str | Path | None = None, seed: int = 0) -> dict:
    """Does right-hand context change a left token's state (it must, bidirectionally), and does a
    causal mask change the contract (left states independent of the right; same tensor shapes)?

    With `model`, its encoder and tokenizer; without, a random 2-layer encoder on random ids. The
    right-hand segment is replaced by other tokens of the same length, so every tensor keeps its shape."""
    import torch

    from .model import BertModel

    g = torch.Generator().manual_seed(seed)
    if model is not None:
        from .checkpoint import load_model
        from .tokenizer import Tokenizer
        enc = load_model(model, head="encoder").eval()
        tok = Tokenizer.from_dir(model)
        e = tok.encode("the river bank was steep and muddy", "so we walked along the road to the town")
        ids, types = torch.tensor([e.input_ids]), torch.tensor([e.token_type_ids])
        special = {tok.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]")}
    else:
        from .config import preset
        torch.manual_seed(seed)
        enc = BertModel(preset("tiny", vocab_size=1000, hidden_size=64, num_heads=2, intermediate_size=128)).eval()
        from .model import init_weights
        init_weights(enc, enc.config)
        ids = torch.randint(5, 1000, (1, 16), generator=g)
        types = torch.tensor([[0] * 8 + [1] * 8])
        special = set()
    right = (types[0] == 1).nonzero().flatten()
    left = (types[0] == 0).nonzero().flatten()
    other = ids.clone()
    vocab = enc.config.vocab_size
    for i in right.tolist()[:-1] if model is not None else right.tolist():   # keep the final [SEP]
        new = int(torch.randint(0, vocab, (1,), generator=g))
        while new in special or new == int(ids[0, i]):
            new = int(torch.randint(0, vocab, (1,), generator=g))
        other[0, i] = new
    causal = BertModel(enc.config.replace(causal=True), add_pooler=enc.pooler is not None).eval()
    causal.load_state_dict(enc.state_dict())
    with torch.no_grad():
        h, h2 = enc(ids, types), enc(other, types)
        c, c2 = causal(ids, types), causal(other, types)
    scale = float(h[0, left].abs().mean())
    res = {"model": str(model) if model else "random 2-layer encoder", "tokens": ids.shape[1],
           "left_tokens": len(left), "shape_bidirectional": list(h.shape), "shape_causal": list(c.shape),
           "left_change_bidirectional": float((h - h2)[0, left].abs().max()),
           "left_change_causal": float((c - c2)[0, left].abs().max()),
           "right_change_causal": float((c - c2)[0, right].abs().max()),
           "causal_vs_bidirectional_left": float((h - c)[0, left].abs().max()), "state_scale": scale}
    tol = 1e-5 * max(scale, 1.0)
    res["right_context_changes_left"] = res["left_change_bidirectional"] > 100 * tol
    res["causal_left_unchanged"] = res["left_change_causal"] <= tol
    res["causal_changes_contract"] = (res["causal_left_unchanged"] and res["shape_causal"] == res["shape_bidirectional"]
                                      and res["causal_vs_bidirectional_left"] > 100 * tol)
    res["passed"] = res["right_context_changes_left"] and res["causal_changes_contract"]
    return res
