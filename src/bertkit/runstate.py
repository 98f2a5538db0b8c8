"""The pre-training loop's state (`Run`, what one run holds; `State`, the part a checkpoint saves;
`Step`, what one update did) and its checkpoints: atomic, verifiable, the last K kept, and nothing
in them runs code.

    RUN/checkpoints/step-00001000/
        model/                 config.json + model.safetensors + tokenizer (transformers loads it)
        trainer.json           loop state (step, data position, elapsed, counters), world size, format
        trainer.safetensors    optimizer and grad-scaler state: tensors, with their structure as JSON
        rng-rank{R}.safetensors  torch / CUDA / numpy / python RNG states of each rank, likewise
        config.yaml            the resolved run config
        manifest.json          size and sha256 of every file above - written last

A checkpoint is written under a temporary name and renamed when complete, so a crash (even
`kill -9`) leaves either the previous checkpoints or a `.tmp-*` folder, never a half-written
`step-*`. `find_checkpoint` verifies the manifest and skips, with a message, any checkpoint whose
files are missing, truncated or altered.

No file is unpickled: a run folder may be shared, and a pickle runs whatever code it names (the
manifest protects nothing, anyone who can edit a file can edit it too). State that is not a tensor
(ints, floats, strings, tuples, dicts with int keys) is written as a JSON tree in the safetensors
header, with `{"$tensor": name}` where a tensor goes. A checkpoint of bertkit 0.1 (pickles:
`trainer.pt`, `rng-rank*.pt`) is refused with one line: resume it with that version.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from . import distributed as D
from .checkpoint import CheckpointError, build, save_model
from .errors import first_line
from .outdir import fsync_path, fsync_tree, mark_incomplete, write_folder
from .runconfig import PretrainConfig, save_config
from .sources import read_json_object

log = logging.getLogger("bertkit")
_STEP_DIR = re.compile(r"^step-(\d+)$")
FORMAT = 2                 # 1 (bertkit 0.1): trainer.pt + rng-rank*.pt pickles, refused; 2: JSON + safetensors
_TREE_KEY = "bertkit.tree"
_NUMPY_DTYPES = {"uint32", "int32", "int64", "uint64", "float32", "float64", "uint8", "bool"}


@dataclass
class State:
    """Everything that changes during training and is saved in a checkpoint."""
    step: int = 0                                    # updates done
    phase: int = 0
    epoch: list = field(default_factory=lambda: [0, 0])
    offset: list = field(default_factory=lambda: [0, 0])   # updates done within the epoch, per phase
    elapsed: float = 0.0                             # seconds of training so far (all sessions)
    tokens: int = 0                                  # real tokens seen (all ranks)
    flops: float = 0.0
    bad_steps: int = 0                               # non-finite losses in a row
    skipped: int = 0                                 # non-finite losses in total
    choices: dict = field(default_factory=dict)      # what this machine chose: precision, attention kernel, packed
    changes: list = field(default_factory=list)      # [update, setting, before, after] where a resume asked otherwise
    planned_steps: int = 0                           # updates a time budget came to (0: no budget)


@dataclass
class Phase:
    """One sequence-length phase: its data, micro-batch and accumulation."""
    name: str
    path: str
    data: Any
    collator: Any
    indices: np.ndarray          # training instances of `data`
    batch_size: int
    grad_accum: int
    max_len: int = 0
    held_out: Any = None         # data.heldout.HeldOut: what evaluation uses (first phase), measured against training


@dataclass
class Run:
    """Everything one pre-training run holds, built by `setup()` and passed to each part of the loop."""
    cfg: PretrainConfig
    world: D.World
    model: Any                   # the model itself (BertForPreTraining): weights, config, saving
    wrapped: Any                 # what runs the forward pass: `model` under DDP / FSDP / torch.compile
    optimizer: torch.optim.Optimizer
    scaler: Any                  # torch.amp.GradScaler for fp16, else None
    state: State                 # what changes while training and is saved in a checkpoint
    phases: list[Phase]          # sequence-length phases: [short] or [short, long]
    tokenizer: Any
    precision: torch.dtype       # the autocast dtype (weights stay fp32)
    precision_reason: str
    packed: bool                 # the encoder runs padding-free (`packing.pack`)
    packed_reason: str
    attention_kernel: str        # what computes attention while training: 'sdpa' or 'math' (`packing.attention`)
    attention_kernel_reason: str
    deterministic: str           # `hardware.deterministic`'s account: on / off, and what that means here
    budget: float                # train.budget in seconds; 0: the run is bounded by train.max_steps
    resumed: bool                # restored from a checkpoint
    eval_batches: list[dict]     # this rank's held-out micro-batches, masked once
    pool: ThreadPoolExecutor     # collates the next update's micro-batches in the background
    orders: dict = field(default_factory=dict)   # {(phase, epoch): permutation of the phase's instances}
    prefetch: tuple | None = None                # ((phase, epoch, offset), future of its micro-batches)
    last_eval: dict | None = None                # the latest evaluation record
    last_eval_elapsed: float = 0.0               # the training clock at the latest evaluation (eval_minutes)
    saved_step: int | None = None                # the update of the latest checkpoint this session wrote


@dataclass
class Step:
    """What one update did (global figures, all ranks): the loop's log window and progress bar read it."""
    loss: float                  # mean over micro-batches
    mlm_loss: float
    nsp_loss: float
    mlm_correct: float
    mlm_count: float
    nsp_correct: float
    nsp_count: float
    tokens: int                  # real tokens
    lr: float
    grad_norm: float
    flops: float


# ---- state as tensors + JSON ---------------------------------------------------------------------
def _encode(obj, tensors: dict[str, torch.Tensor]):
    """A JSON-able tree of `obj`; tensors (and numpy arrays) go into `tensors` under t0, t1, ..."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, torch.Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = obj.detach().to("cpu").contiguous()
        return {"$tensor": name}
    if isinstance(obj, np.ndarray):
        name = f"t{len(tensors)}"
        tensors[name] = torch.from_numpy(np.ascontiguousarray(obj).astype(np.int64 if obj.dtype.kind == "u" else obj.dtype))
        return {"$ndarray": name, "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return _encode(obj.item(), tensors)
    if isinstance(obj, tuple):
        return {"$tuple": [_encode(x, tensors) for x in obj]}
    if isinstance(obj, list):
        return [_encode(x, tensors) for x in obj]
    if isinstance(obj, dict):
        if not all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in obj):
            raise TypeError(f"cannot save a dict with keys {[type(k).__name__ for k in obj][:5]}")
        return {"$dict": [[k, _encode(v, tensors)] for k, v in obj.items()]}
    raise TypeError(f"cannot save a {type(obj).__name__} in a checkpoint (tensors, numbers, strings, "
                    "lists, tuples and dicts only)")


def _decode(node, tensors: dict[str, torch.Tensor], where: str):
    """The inverse of `_encode`; anything it did not write is a CheckpointError naming `where`."""
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):
        return [_decode(x, tensors, where) for x in node]
    if isinstance(node, dict) and len(node) == 1 and "$tensor" in node:
        if node["$tensor"] not in tensors:
            raise CheckpointError(f"{where}: names a tensor {str(node['$tensor'])[:50]!r} the file does not hold")
        return tensors[node["$tensor"]]
    if isinstance(node, dict) and set(node) == {"$ndarray", "dtype"}:
        if node["$ndarray"] not in tensors or node["dtype"] not in _NUMPY_DTYPES:
            raise CheckpointError(f"{where}: a bad numpy array entry {str(node)[:80]}")
        return tensors[node["$ndarray"]].numpy().astype(node["dtype"])
    if isinstance(node, dict) and len(node) == 1 and isinstance(node.get("$tuple"), list):
        return tuple(_decode(x, tensors, where) for x in node["$tuple"])
    if isinstance(node, dict) and len(node) == 1 and isinstance(node.get("$dict"), list):
        out = {}
        for item in node["$dict"]:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], (str, int))
                    and not isinstance(item[0], bool)):
                raise CheckpointError(f"{where}: a bad dict entry {str(item)[:80]}")
            out[item[0]] = _decode(item[1], tensors, where)
        return out
    raise CheckpointError(f"{where}: unexpected entry {str(node)[:80]} (not written by bertkit)")


def save_state(obj, path: Path) -> None:
    """Write a tree of tensors, numbers, strings, lists, tuples and dicts to one safetensors file."""
    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(obj, tensors)
    save_file(tensors, str(path), metadata={_TREE_KEY: json.dumps(tree), "format": "pt"})


def load_state(path: Path):
    """Read what `save_state` wrote; a file that is not one is a CheckpointError (nothing is unpickled)."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # not a safetensors file, truncated, ...
        raise CheckpointError(f"{path}: not a readable safetensors file ({type(e).__name__}: "
                              f"{first_line(e, 150)})") from None
    if _TREE_KEY not in meta:
        raise CheckpointError(f"{path}: no {_TREE_KEY} entry in its header (not written by bertkit)")
    try:
        return _decode(json.loads(meta[_TREE_KEY]), tensors, str(path))
    except ValueError as e:
        raise CheckpointError(f"{path}: its {_TREE_KEY} header is not valid JSON ({e})") from None
    except RecursionError:
        raise CheckpointError(f"{path}: its {_TREE_KEY} header is nested too deeply") from None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def export_model(run: Run, world: D.World, path: Path, model_sd: dict | None = None) -> None:
    """Write the model as a Hugging Face folder (+ tokenizer) at `path` (rank 0 writes), whole or
    not at all: written to `path.incomplete`, then swapped in (`outdir.write_folder`).

    With FSDP every rank must call this (the full weights are gathered)."""
    model = run.model
    if model_sd is None and world.distributed and run.cfg.train.distributed == "fsdp":
        model_sd, _ = D.full_state_dicts(model, run.optimizer, "fsdp", world)
    if not world.main:
        return
    if model_sd is not None:                     # a plain CPU copy of sharded weights (all loaded: no random init)
        model = build("pretraining", model.config, random_init=False, nsp=model.nsp is not None)
        model.load_state_dict(model_sd)

    def write(tmp: Path) -> None:
        save_model(model, tmp, extra_config=mark_incomplete({}, f"{path.name}/ being written"))
        run.tokenizer.save(tmp)

    write_folder(path, write)     # staged, then swapped in: a kill leaves the old folder or none, never half of one


def save_checkpoint(run: Run, world: D.World) -> Path | None:
    """Save the complete training state of update `state.step`; keep the last K."""
    cfg, st = run.cfg, run.state
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
    save_state(rng, tmp / f"rng-rank{world.rank}.safetensors")
    model_sd, optim_sd = D.full_state_dicts(run.model, run.optimizer, cfg.train.distributed, world) \
        if world.distributed and cfg.train.distributed == "fsdp" else (None, run.optimizer.state_dict())
    export_model(run, world, tmp / "model", model_sd)
    D.barrier(world)
    if world.main:
        save_state({"optimizer": optim_sd, "scaler": run.scaler.state_dict() if run.scaler else None},
                   tmp / "trainer.safetensors")
        trainer = {"format": FORMAT, "state": dataclasses.asdict(st), "world_size": world.world_size}
        (tmp / "trainer.json").write_text(json.dumps(trainer, indent=1) + "\n", encoding="utf-8")
        save_config(cfg, tmp / "config.yaml")
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        manifest = {"step": st.step, "files": {str(p.relative_to(tmp)): {"size": p.stat().st_size,
                                                                          "sha256": _sha256(p)} for p in files}}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
        fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        fsync_path(root)
        _prune(root, cfg.train.keep_checkpoints)
        log.debug("checkpoint %s", final)
    D.barrier(world)
    run.saved_step = st.step
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
        if not isinstance(files, dict) or not all(isinstance(m, dict) and isinstance(m.get("size"), int)
                                                  and isinstance(m.get("sha256"), str) for m in files.values()):
            raise ValueError("bad 'files' entry")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError) as e:
        return f"unreadable manifest.json ({e})"
    for name, meta in files.items():
        p = path / name
        if Path(name).is_absolute() or ".." in Path(name).parts:
            return f"manifest.json names a file outside the checkpoint ({name[:80]!r})"
        if not p.is_file():
            return f"{name} is missing"
        if p.stat().st_size != meta["size"]:
            return f"{name} has {p.stat().st_size} bytes, expected {meta['size']} (truncated?)"
        if _sha256(p) != meta["sha256"]:
            return f"{name} does not match its checksum (corrupt)"
    needed = ("trainer.json", "trainer.safetensors", "model/model.safetensors", "model/config.json")
    return next((f"{need} is not in the manifest" for need in needed if need not in files), None)


def find_checkpoint(root: Path) -> Path | None:
    """The newest intact `step-*` checkpoint under `root`; corrupt ones are skipped with a message."""
    root = Path(root)
    if not root.is_dir():
        return None
    steps = sorted(((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name))), reverse=True)
    for _, p in steps:
        if (p / "trainer.pt").exists():
            raise CheckpointError(f"{p}: written by an older bertkit in the pickle format (trainer.pt): "
                                  "resume it with that version")
        problem = verify(p)
        if problem is None:
            return p
        log.warning("skipping checkpoint %s: %s", p, problem)
    return None


def load_checkpoint(run: Run, path: Path, world: D.World) -> None:
    """Restore optimizer, scaler, loop state and RNGs (the weights were loaded when the model was built)."""
    trainer, rng = _read_trainer(path), _read_rng(path, world.rank)
    try:
        if world.distributed and run.cfg.train.distributed == "fsdp":
            D.load_optimizer_state(run.model, run.optimizer, trainer["optimizer"])
        else:
            run.optimizer.load_state_dict(trainer["optimizer"])
        if run.scaler is not None and trainer.get("scaler"):
            run.scaler.load_state_dict(trainer["scaler"])
    except (KeyError, ValueError, TypeError, IndexError, RuntimeError) as e:
        raise CheckpointError(f"{path}: its optimizer state does not fit this run's model and optimizer "
                              f"({type(e).__name__}: {first_line(e, 150)})") from None
    saved = trainer["state"]                     # a dict: _read_trainer checked
    unknown = set(saved) - {f.name for f in dataclasses.fields(State)}
    if unknown:
        raise CheckpointError(f"{path}: loop state has unknown fields {sorted(unknown)!r:.80}")
    for k, v in saved.items():
        default = getattr(State(), k)
        if type(v) is not type(default) and not (isinstance(default, float) and type(v) is int):
            raise CheckpointError(f"{path}: loop state {k}={v!r:.40} is not a {type(default).__name__}")
        setattr(run.state, k, v)
    if trainer["world_size"] != world.world_size:
        log.warning("%s was written by %d processes, resuming on %d: the data order changes from here",
                    path, trainer["world_size"], world.world_size)
    if rng is not None:
        try:
            torch.set_rng_state(rng["torch"])
            np.random.set_state(rng["numpy"])
            random.setstate(rng["python"])
            if rng.get("cuda") is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(rng["cuda"])
        except (KeyError, ValueError, TypeError, RuntimeError) as e:
            raise CheckpointError(f"{path}: unusable RNG state ({type(e).__name__}: "
                                  f"{first_line(e, 150)})") from None


def saved_state(path: Path) -> dict:
    """The loop state a checkpoint holds (trainer.json's 'state'; {} for an old or unreadable one),
    read before the run is built: its recorded choices decide how the resumed run computes."""
    try:
        state = json.loads((Path(path) / "trainer.json").read_text(encoding="utf-8")).get("state")
    except (OSError, ValueError, UnicodeDecodeError, AttributeError):
        return {}
    return state if isinstance(state, dict) else {}


def _read_trainer(path: Path) -> dict:
    """{'optimizer', 'scaler', 'state', 'world_size'} of a checkpoint."""
    meta = read_json_object(path / "trainer.json", CheckpointError)
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path / 'trainer.json'}: format {meta.get('format')} is not {FORMAT} "
                              f"(written by another bertkit version?)")
    tensors = load_state(path / "trainer.safetensors")
    if not isinstance(tensors, dict) or not isinstance(tensors.get("optimizer"), dict):
        raise CheckpointError(f"{path / 'trainer.safetensors'}: holds no optimizer state")
    if not isinstance(meta.get("world_size", 1), int) or not isinstance(meta.get("state"), dict):
        raise CheckpointError(f"{path / 'trainer.json'}: bad 'state' or 'world_size'")
    return {**tensors, "state": meta["state"], "world_size": meta.get("world_size", 1)}


def _read_rng(path: Path, rank: int) -> dict | None:
    file = path / f"rng-rank{rank}.safetensors"
    if not file.is_file():
        return None
    rng = load_state(file)
    if not isinstance(rng, dict):
        raise CheckpointError(f"{file}: not an RNG state")
    return rng
