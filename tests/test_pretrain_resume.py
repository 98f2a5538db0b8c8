"""Exact resume after `kill -9`, corrupt checkpoints skipped, and 2-process DDP on CPU (gloo)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_pretrain import make_data, tiny_config

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data64(tmp_path_factory) -> Path:
    return make_data(tmp_path_factory.mktemp("resume_data"), (64,))[64]


def _args(cfg) -> list[str]:
    """The config as command-line overrides (a subprocess runs `python -m bertkit pretrain`)."""
    from bertkit.runconfig import to_dict

    out = []
    for section, values in to_dict(cfg).items():
        if isinstance(values, dict):
            out += [f"--{section}.{k}={json.dumps(v)}" for k, v in values.items() if v is not None]
        else:
            out.append(f"--{section}={json.dumps(values) if not isinstance(values, str) else values}")
    return out


def _run(args: list[str], torchrun: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    prefix = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={torchrun}"] \
        if torchrun else [sys.executable]
    return subprocess.run(prefix + ["-m", "bertkit", "pretrain", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


# A pre-training run (the config as command-line overrides) that SIGKILLs itself right after update N,
# through pretrain()'s on_step: no cleanup runs, no final checkpoint is written.
_KILLED_AT = """
import os, signal, sys
from bertkit.runconfig import PretrainConfig, load_config
from bertkit.train import pretrain

step = int(sys.argv[1])
pretrain(load_config(PretrainConfig, None, sys.argv[2:]),
         on_step=lambda st: os.kill(os.getpid(), signal.SIGKILL) if st.step == step else None)
"""


def _run_killed_at(step: int, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _KILLED_AT, str(step), *args], cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)


def _losses(run: Path) -> list[tuple]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"], r["mlm_loss"], r["nsp_loss"], r["mlm_accuracy"], r["lr"]) for r in rows]


def _evals(run: Path) -> list[dict]:
    """eval.jsonl without wall-clock fields (a resumed run took a different time to get there)."""
    rows = [json.loads(x) for x in (run / "eval.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("elapsed_s", "time")} for r in rows]


def test_kill_9_then_resume_gives_identical_losses(data64, tmp_path):
    from bertkit.train import pretrain

    straight = tiny_config(data64, tmp_path / "straight", **{"train.max_steps": 20, "train.checkpoint_every": 10,
                                                             "train.eval_every": 10})
    pretrain(straight)
    crashed = tiny_config(data64, tmp_path / "crashed", **{"train.max_steps": 20, "train.checkpoint_every": 10,
                                                           "train.eval_every": 10})
    # update 13 done, checkpoint 10 on disk: SIGKILL, no cleanup, no final checkpoint
    proc = _run_killed_at(13, _args(crashed))
    assert proc.returncode == -9, proc.stderr[-2000:]
    ckpts = sorted(p.name for p in (tmp_path / "crashed" / "checkpoints").iterdir())
    assert ckpts == ["step-00000010"]
    assert max(s for s, *_ in _losses(tmp_path / "crashed")) == 12           # updates 11-12 were logged
    crashed.resume = True
    pretrain(crashed)
    assert _losses(tmp_path / "crashed") == _losses(tmp_path / "straight")   # bit-identical, steps 1..20
    assert _evals(tmp_path / "crashed") == _evals(tmp_path / "straight")


def test_corrupt_and_partial_checkpoints_are_skipped(data64, tmp_path, caplog):
    from bertkit.runstate import find_checkpoint
    from bertkit.train import pretrain

    cfg = tiny_config(data64, tmp_path / "run", **{"train.max_steps": 6, "train.checkpoint_every": 2,
                                                   "train.keep_checkpoints": 3, "train.eval_every": 0})
    pretrain(cfg)
    root = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step-00000002", "step-00000004", "step-00000006"]
    assert find_checkpoint(root).name == "step-00000006"
    weights = root / "step-00000006" / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])                          # truncated
    shutil.copytree(root / "step-00000004", root / "step-00000008")
    (root / "step-00000008" / "manifest.json").unlink()                      # never finished
    trainer = root / "step-00000004" / "trainer.safetensors"
    blob = bytearray(trainer.read_bytes())
    blob[len(blob) // 2] ^= 0xFF                                               # one flipped bit... byte
    trainer.write_bytes(bytes(blob))
    with caplog.at_level("WARNING", logger="bertkit"):
        assert find_checkpoint(root).name == "step-00000002"
    text = caplog.text
    assert "step-00000008: no manifest.json" in text and "truncated" in text and "checksum" in text
    cfg.resume, cfg.train.max_steps = True, 8
    card = pretrain(cfg)
    assert card["updates"] == 8


def test_two_processes_match_one_with_the_same_global_batch(data64, tmp_path):
    """1 process x 2 accumulation steps vs 2 processes (torchrun, gloo) x 1: global batch 8 both."""
    one = tiny_config(data64, tmp_path / "one", **{"train.max_steps": 6, "train.grad_accum": 2,
                                                   "train.eval_every": 3, "train.checkpoint_every": 0})
    two = tiny_config(data64, tmp_path / "two", **{"train.max_steps": 6, "train.grad_accum": 1,
                                                   "train.eval_every": 3, "train.checkpoint_every": 0})
    from bertkit.train import pretrain

    pretrain(one)
    p2 = _run(_args(two), torchrun=2)
    assert p2.returncode == 0, p2.stderr[-3000:]
    a, b = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert [r[0] for r in a] == [r[0] for r in b] == list(range(1, 7))
    # same sequences, masks and dropout; only the order of float sums differs (all-reduce vs accumulation)
    for ra, rb in zip(a, b):
        for x, y in zip(ra[1:], rb[1:]):
            assert abs(x - y) <= 1e-4 * max(1.0, abs(x)), (ra, rb)
    card = json.loads((tmp_path / "two" / "run_card.json").read_text())
    assert card["world_size"] == 2 and card["global_batch"] == 8
    # FSDP (fully_shard per block, gloo): the same numbers, and its checkpoint is one full HF folder
    fsdp = tiny_config(data64, tmp_path / "fsdp", **{"train.max_steps": 6, "train.grad_accum": 1,
                                                     "train.eval_every": 3, "train.checkpoint_every": 0,
                                                     "train.distributed": "fsdp"})
    p3 = _run(_args(fsdp), torchrun=2)
    assert p3.returncode == 0, p3.stderr[-3000:]
    for ra, rc in zip(a, _losses(tmp_path / "fsdp")):
        for x, y in zip(ra[1:], rc[1:]):
            assert abs(x - y) <= 1e-4 * max(1.0, abs(x)), (ra, rc)
    from bertkit.checkpoint import load_model
    assert load_model(tmp_path / "fsdp" / "final", head="pretraining").config.hidden_size == 64
    ea = [json.loads(x) for x in (tmp_path / "one" / "eval.jsonl").read_text().splitlines()]
    eb = [json.loads(x) for x in (tmp_path / "two" / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in ea] == [e["step"] for e in eb] == [0, 3, 6]
    for x, y in zip(ea, eb):
        assert abs(x["eval_mlm_loss"] - y["eval_mlm_loss"]) < 1e-4


def test_sigterm_saves_a_checkpoint_and_stops(data64, tmp_path):
    import signal
    import time

    cfg = tiny_config(data64, tmp_path / "run", **{"train.max_steps": 100000, "train.checkpoint_every": 0,
                                                   "train.eval_every": 0})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "bertkit", "pretrain", *_args(cfg)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    card = json.loads((tmp_path / "run" / "run_card.json").read_text())
    assert card["stop_reason"] == "signal SIGTERM" and 3 <= card["updates"] < 100000
    from bertkit.runstate import find_checkpoint
    assert find_checkpoint(tmp_path / "run" / "checkpoints").name == f"step-{card['updates']:08d}"
    assert "SIGTERM received: saving a checkpoint" in err


def _to_format_1(ckpt: Path) -> None:
    """Rewrite a checkpoint as bertkit 0.1 wrote it: trainer.pt and rng-rank0.pt pickles."""
    import hashlib

    import torch

    from bertkit.runstate import _read_trainer, load_state

    torch.save(_read_trainer(ckpt), ckpt / "trainer.pt")
    torch.save(load_state(ckpt / "rng-rank0.safetensors"), ckpt / "rng-rank0.pt")
    for name in ("trainer.json", "trainer.safetensors", "rng-rank0.safetensors"):
        (ckpt / name).unlink()
    files = sorted(p for p in ckpt.rglob("*") if p.is_file() and p.name != "manifest.json")
    manifest = {"step": int(ckpt.name[5:]), "files": {str(p.relative_to(ckpt)): {
        "size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()} for p in files}}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def test_checkpoints_hold_no_pickle_and_old_format_checkpoints_are_refused(data64, tmp_path):
    """Format 2 is JSON + safetensors; a format-1 checkpoint (pickles) is refused with one line, not
    skipped (a resume would silently start from scratch) and not unpickled."""
    from bertkit.checkpoint import CheckpointError
    from bertkit.train import pretrain

    cfg = tiny_config(data64, tmp_path / "run", **{"train.max_steps": 8, "train.checkpoint_every": 4})
    pretrain(cfg)
    ckpt = tmp_path / "run" / "checkpoints" / "step-00000008"
    names = sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file())
    assert not [n for n in names if n.endswith((".pt", ".bin", ".pkl", ".npy"))], names
    assert {"trainer.json", "trainer.safetensors", "rng-rank0.safetensors"} <= set(names)
    assert json.loads((ckpt / "trainer.json").read_text())["state"]["step"] == 8

    shutil.rmtree(ckpt)
    _to_format_1(tmp_path / "run" / "checkpoints" / "step-00000004")
    cfg.resume = True
    with pytest.raises(CheckpointError, match="step-00000004: written by an older bertkit in the pickle format"):
        pretrain(cfg)


# The same run, SIGKILLed when final/ gets its tokenizer (its weights and config.json already written).
_KILLED_IN_FINAL = """
import os, signal, sys
from bertkit.runconfig import PretrainConfig, load_config
from bertkit.tokenizer import Tokenizer
from bertkit.train import pretrain

save = Tokenizer.save
Tokenizer.save = lambda self, path: (os.kill(os.getpid(), signal.SIGKILL) if "final" in os.path.basename(path)
                                     else save(self, path))
pretrain(load_config(PretrainConfig, None, sys.argv[1:]))
"""


def test_a_kill_while_final_is_written_leaves_no_final(data64, tmp_path, capsys):
    """final/ is written aside (final.incomplete/, its config.json marked) and swapped in whole: a
    kill -9 between its weights and its tokenizer leaves no final/, the leftover is refused by name,
    and `--resume` writes a complete final/. `bertkit info` refuses a folder with no tokenizer."""
    from bertkit.cli import main

    cfg = tiny_config(data64, tmp_path / "run", **{"train.max_steps": 4, "train.checkpoint_every": 4})
    p = subprocess.run([sys.executable, "-c", _KILLED_IN_FINAL, *_args(cfg)], cwd=REPO, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == -9, p.stderr[-2000:]
    out = tmp_path / "run"
    assert not (out / "final").exists()
    left = out / "final.incomplete"
    assert sorted(f.name for f in left.iterdir()) == ["config.json", "model.safetensors"]
    capsys.readouterr()
    assert main(["info", str(left)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unfinished run" in err[0], err
    bare = tmp_path / "no-tokenizer"                      # what the kill left before: weights, no tokenizer
    shutil.copytree(left, bare)
    cj = json.loads((bare / "config.json").read_text())
    cj.pop("bertkit_incomplete")
    (bare / "config.json").write_text(json.dumps(cj))
    assert main(["info", str(bare)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no vocab.txt or tokenizer.json" in err[0], err
    assert _run([*_args(cfg), "--resume"]).returncode == 0
    assert not left.exists() and {"vocab.txt", "tokenizer.json", "config.json"} <= {f.name for f in (out / "final").iterdir()}
    assert "bertkit_incomplete" not in json.loads((out / "final" / "config.json").read_text())
    assert main(["info", str(out / "final")]) == 0


def test_a_failed_final_keeps_the_previous_complete_one(data64, tmp_path, monkeypatch):
    """A run that fails while writing final/ (its tokenizer save raises) leaves the previous final/
    as it was, and no staging folder."""
    from bertkit.tokenizer import Tokenizer
    from bertkit.train import pretrain

    cfg = tiny_config(data64, tmp_path / "run", **{"train.max_steps": 4, "train.checkpoint_every": 4})
    pretrain(cfg)
    final = tmp_path / "run" / "final"
    before = {f.name: f.read_bytes() for f in final.iterdir()}
    save = Tokenizer.save

    def failing(self, path):
        if "final" in Path(path).name:
            (Path(path) / "vocab.txt").write_text("half\n")
            raise OSError("disk full")
        save(self, path)

    monkeypatch.setattr(Tokenizer, "save", failing)
    cfg.resume, cfg.train.max_steps = True, 8
    with pytest.raises(OSError, match="disk full"):
        pretrain(cfg)
    assert {f.name: f.read_bytes() for f in final.iterdir()} == before
    assert not (tmp_path / "run" / "final.incomplete").exists()
    assert (tmp_path / "run" / "checkpoints" / "step-00000008").is_dir()      # the run itself got to its end
