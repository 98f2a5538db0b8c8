"""Training checkpoints: atomic, verifiable, the last K kept.

    RUN/checkpoints/step-00001000/
        model/            config.json + model.safetensors + tokenizer (transformers loads it)
        trainer.pt        optimizer, grad scaler, loop state (step, data position, elapsed, counters)
        rng-rank{R}.pt    torch / CUDA / numpy / python RNG states of each rank
        config.yaml       the resolved run config
        manifest.json     size and sha256 of every file above - written last

A checkpoint is written under a temporary name and renamed when complete, so a crash (even
`kill -9`) leaves either the previous checkpoints or a `.tmp-*` folder, never a half-written
`step-*`. `find_checkpoint` verifies the manifest and skips, with a message, any checkpoint whose
files are missing, truncated or altered.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from . import distributed as D
from .checkpoint import build, save_model
from .runconfig import save_config

log = logging.getLogger("bertkit")
_STEP_DIR = re.compile(r"^step-(\d+)$")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def export_model(run: dict, world: D.World, path: Path, model_sd: dict | None = None) -> None:
    """Write the model as a Hugging Face folder (+ tokenizer) at `path` (rank 0 writes).

    With FSDP every rank must call this (the full weights are gathered)."""
    model = run["model"]
    if model_sd is None and world.distributed and run["cfg"].train.distributed == "fsdp":
        model_sd, _ = D.full_state_dicts(model, run["optimizer"], "fsdp", world)
    if not world.main:
        return
    if model_sd is not None:                     # a plain CPU copy of sharded weights
        cpu = build("pretraining", model.config, nsp=model.nsp is not None)
        cpu.load_state_dict(model_sd)
        model = cpu
    save_model(model, path)
    run["tokenizer"].save(path)


def save_checkpoint(run: dict, world: D.World) -> Path | None:
    """Save the complete training state of update `state.step`; keep the last K."""
    cfg, st = run["cfg"], run["state"]
    root = Path(cfg.out) / "checkpoints"
    final = root / f"step-{st.step:08d}"
    tmp = root / f".tmp-step-{st.step:08d}"
    if world.main:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    D.barrier(world)
    rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
           "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
    torch.save(rng, tmp / f"rng-rank{world.rank}.pt")
    fsdp = world.distributed and cfg.train.distributed == "fsdp"
    model_sd, optim_sd = D.full_state_dicts(run["model"], run["optimizer"], cfg.train.distributed, world) \
        if fsdp else (None, run["optimizer"].state_dict())
    export_model(run, world, tmp / "model", model_sd)
    D.barrier(world)
    if world.main:
        trainer = {"optimizer": optim_sd, "scaler": run["scaler"].state_dict() if run["scaler"] else None,
                   "state": dataclasses.asdict(st), "world_size": world.world_size}
        torch.save(trainer, tmp / "trainer.pt")
        save_config(cfg, tmp / "config.yaml")
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        manifest = {"step": st.step, "files": {str(p.relative_to(tmp)): {"size": p.stat().st_size,
                                                                          "sha256": _sha256(p)} for p in files}}
        for p in files:
            with p.open("rb") as f:
                os.fsync(f.fileno())
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
        _fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        _fsync_dir(root)
        _prune(root, cfg.train.keep_checkpoints)
        log.debug("checkpoint %s", final)
    D.barrier(world)
    run["saved_step"] = st.step
    return final


def _prune(root: Path, keep: int) -> None:
    """Keep the newest `keep` checkpoints; remove leftovers of interrupted saves (.tmp-step-*)."""
    steps = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)))
    for _, p in steps[:-keep] if keep > 0 else []:
        shutil.rmtree(p, ignore_errors=True)
    for p in root.glob(".tmp-step-*"):
        shutil.rmtree(p, ignore_errors=True)


def verify(path: Path) -> str | None:
    """None if the checkpoint is complete and intact, else what is wrong with it."""
    mpath = path / "manifest.json"
    if not mpath.exists():
        return "no manifest.json (incomplete)"
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
        files = manifest["files"]
    except (ValueError, KeyError, UnicodeDecodeError) as e:
        return f"unreadable manifest.json ({e})"
    for name, meta in files.items():
        p = path / name
        if not p.exists():
            return f"{name} is missing"
        if p.stat().st_size != meta["size"]:
            return f"{name} has {p.stat().st_size} bytes, expected {meta['size']} (truncated?)"
        if _sha256(p) != meta["sha256"]:
            return f"{name} does not match its checksum (corrupt)"
    for need in ("trainer.pt", "model/model.safetensors", "model/config.json"):
        if need not in files:
            return f"{need} is not in the manifest"
    return None


def find_checkpoint(root: Path) -> Path | None:
    """The newest intact `step-*` checkpoint under `root`; corrupt ones are skipped with a message."""
    root = Path(root)
    if not root.is_dir():
        return None
    steps = sorted(((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name))), reverse=True)
    for _, p in steps:
        problem = verify(p)
        if problem is None:
            return p
        log.warning("skipping checkpoint %s: %s", p, problem)
    return None


def load_checkpoint(run: dict, path: Path, world: D.World) -> None:
    """Restore optimizer, scaler, loop state and RNGs (the weights were loaded when the model was built)."""
    from .train import State

    trainer = torch.load(path / "trainer.pt", map_location="cpu", weights_only=False)
    cfg = run["cfg"]
    if world.distributed and cfg.train.distributed == "fsdp":
        D.load_optimizer_state(run["model"], run["optimizer"], trainer["optimizer"])
    else:
        run["optimizer"].load_state_dict(trainer["optimizer"])
    if run["scaler"] is not None and trainer.get("scaler"):
        run["scaler"].load_state_dict(trainer["scaler"])
    st = run["state"]
    for k, v in trainer["state"].items():
        setattr(st, k, v)
    if trainer.get("world_size", 1) != world.world_size:
        log.warning("%s was written by %d processes, resuming on %d: the data order changes from here",
                    path, trainer.get("world_size", 1), world.world_size)
    rng_file = path / f"rng-rank{world.rank}.pt"
    if rng_file.exists():
        rng = torch.load(rng_file, map_location="cpu", weights_only=False)
        torch.set_rng_state(rng["torch"])
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])
        if rng.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
    assert isinstance(st, State)
