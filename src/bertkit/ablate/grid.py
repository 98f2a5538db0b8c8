"""The grid: checks before anything is written, the dry run, and the arms run in order or in several
processes sharing OUT through atomic claims (`run_grid`)."""
from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from ..data.prepare import PrepareConfig
from ..errors import BertkitError
from ..runconfig import from_dict, merge, to_dict
from .arm import RunOptions, _now, finetune_config, finished, one_line, pretrain_config, run_arm
from .config import AblateConfig, Arm, _read_json, describe, flatten, lr_search_of
from .measure import budget_info
from .shared import Shared

log = logging.getLogger("bertkit")

# ---- the grid -------------------------------------------------------------------------------------
class _GridLines(logging.Filter):
    """On the console, only the grid's own lines and errors; each arm's log.txt has everything (the
    grid says how many warnings an arm logged)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or str(record.msg).startswith("ablate:")


def resolve(cfg: AblateConfig, arm: Arm) -> dict:
    """The arm's configs with placeholder paths (no data made): raises what running the arm would."""
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
        if data is not None and not (Path(cfg.data_dir) / data).exists():          # (absolute: as it is)
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
    everything finished is `report.write_report`, which `bertkit ablate` calls next. With
    cfg.jobs > 1 the arms run in that many processes."""
    opts = opts or RunOptions()
    arms = list(cfg.arms if arms is None else arms)
    check_base(cfg)
    check_inputs(cfg)
    shared = Shared(cfg)
    quiet = [] if opts.verbose else [h for h in logging.getLogger().handlers if not isinstance(h, logging.FileHandler)]
    for h in quiet:
        h.addFilter(_QUIET)
    try:
        return _run_jobs(cfg, arms, shared, opts) if cfg.jobs > 1 else _run_arms(cfg, arms, shared, opts)
    finally:
        for h in quiet:
            h.removeFilter(_QUIET)


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


def _one_arm(cfg, arm, shared, opts, ran, k, total, t0, left) -> None:
    log.info("ablate: [%d/%d] arm %s: %s", k, total, arm.name, describe(arm))
    t = time.time()
    state = run_arm(cfg, arm, shared, opts)
    ran.append(state)
    mean = (time.time() - t0) / len(ran)
    log.info("ablate: arm %s %s in %.1f min%s; %d arm(s) left, about %.0f min at this pace", arm.name,
             state["status"], (time.time() - t) / 60,
             f" ({state['warnings']} warnings in its log.txt)" if state.get("warnings") else "", left,
             left * mean / cfg.jobs / 60)


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


JOB_GRACE_S = 60.0       # after a Ctrl-C, how long the jobs get together to record their arms as interrupted


def _stop_jobs(procs: list, grace_s: float) -> None:
    """Wait for every job to exit within one shared grace period (not one each: 13 jobs could hold a
    stopped grid for 13 minutes), then terminate the ones still running."""
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.terminate()


def _run_jobs(cfg: AblateConfig, arms: list[Arm], shared: Shared, opts: RunOptions) -> dict:
    """cfg.jobs processes (`bertkit ablate CONFIG --arms ... --jobs 1`) share the arms through claims;
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
    threads = cfg.threads or max(1, (os.cpu_count() or 1) // cfg.jobs)
    cmd = [sys.executable, "-m", "bertkit"] + (["-v"] if opts.verbose else []) + [
        "ablate", cfg.source, "--out", cfg.out, "--data-dir", cfg.data_dir, "--no-report", "--jobs", "1",
        "--threads", str(threads), "--arms", ",".join(a.name for a in arms)] + (
        ["--pretrain-only"] if opts.pretrain_only else [])
    log.info("ablate: %d jobs of %d thread(s) each over %d arms", cfg.jobs, threads, len(arms))
    procs = [subprocess.Popen(cmd, env={**os.environ, "BERTKIT_ABLATE_JOB": str(j)}) for j in range(cfg.jobs)]
    try:
        codes = [p.wait() for p in procs]
    except KeyboardInterrupt:                      # the jobs got the Ctrl-C too: let them record it
        _stop_jobs(procs, JOB_GRACE_S)
        raise
    states = [_read_json(Path(cfg.out) / "arms" / a.name / "arm.json") or {} for a in arms]
    return {"jobs": cfg.jobs, "exit_codes": codes,
            "done": [s.get("name") for s in states if s.get("status") in ("done", "pretrained")],
            "failed": [s.get("name") for s in states if s.get("status") in ("failed", "interrupted")],
            "wall_s": round(time.time() - t0, 1)}
