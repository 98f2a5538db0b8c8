"""Fine-tuning output folders are complete and consistent, or visibly incomplete: written as
OUT.incomplete and swapped in when done (`bertkit.outdir`), a killed run's best-so-far checkpoint
refused by every reader, a failed run leaving nothing behind; `kill -9` at random points of a
rerun into an existing folder."""
from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bertkit import load_model
from bertkit.checkpoint import CheckpointError, read_config
from bertkit.errors import BertkitError
from bertkit.finetune import FinetuneConfig, finetune
from bertkit import outdir
from bertkit.outdir import staged_dir
from test_finetune import conll_dir, sst_dir, tiny_model  # noqa: F401  (fixtures)

REPO = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_thread")    # conftest: tiny models, one thread


def cfg(**kw) -> FinetuneConfig:
    base = dict(task="sst2", batch_size=16, lr=2e-3, epochs=1, progress=False, max_length=32, log_every=5)
    base.update(kw)
    return FinetuneConfig(**base)


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ---- the staging folder ------------------------------------------------------------------------
def owned(p: Path) -> bool:
    return (p / "mine").is_file()


def test_staged_dir_replaces_whole_folders(tmp_path):
    out = tmp_path / "a" / "b" / "run"
    with staged_dir(out, owned) as tmp:
        assert tmp == tmp_path / "a" / "b" / "run.incomplete" and not out.exists()
        (tmp / "mine").write_text("1")
        (tmp / "old_only").write_text("x")
    assert sorted(p.name for p in out.iterdir()) == ["mine", "old_only"]
    with staged_dir(out, owned) as tmp:
        (tmp / "mine").write_text("2")
        assert (out / "old_only").is_file()                   # the previous run stays until the swap
    assert sorted(p.name for p in out.iterdir()) == ["mine"] and (out / "mine").read_text() == "2"
    assert sorted(p.name for p in out.parent.iterdir()) == ["run"]


def test_staged_dir_without_atomic_exchange(tmp_path, monkeypatch):
    monkeypatch.setattr(outdir, "_exchange", lambda a, b: False)
    out = tmp_path / "run"
    for n in ("1", "2"):
        with staged_dir(out, owned) as tmp:
            (tmp / "mine").write_text(n)
    assert (out / "mine").read_text() == "2" and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_staged_dir_on_errors(tmp_path):
    out = tmp_path / "new" / "run"
    with pytest.raises(ValueError):
        with staged_dir(out, owned) as tmp:
            (tmp / "metrics.jsonl").write_text("{}\n")
            raise ValueError("boom")
    assert not (tmp_path / "new").exists()                   # nothing left, not even the parent it made
    with pytest.raises(KeyboardInterrupt):                   # a checkpoint worth a look is kept, marked
        with staged_dir(out, owned) as tmp:
            (tmp / "config.json").write_text(json.dumps({"bertkit_incomplete": "fine-tuning in progress"}))
            raise KeyboardInterrupt
    assert (tmp_path / "new" / "run.incomplete" / "config.json").is_file() and not out.exists()
    with staged_dir(out, owned) as tmp:                      # the next run clears it
        (tmp / "mine").write_text("1")
    assert sorted(p.name for p in out.parent.iterdir()) == ["run"]


def test_staged_dir_refuses_foreign_folders_and_live_writers(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.tsv").write_text("keep me")
    with pytest.raises(BertkitError, match="holds other files"):
        with staged_dir(tmp_path / "data", owned):
            pass
    assert (tmp_path / "data" / "train.tsv").read_text() == "keep me"
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    for here in (".", "..", str(empty) + "/"):
        with pytest.raises(BertkitError, match="current folder"):
            with staged_dir(here, owned):
                pass
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(BertkitError, match="is a file"):
        with staged_dir(tmp_path / "file", owned):
            pass
    busy = tmp_path / "busy.incomplete"
    busy.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (busy / ".bertkit-writer").write_text(f"{sleeper.pid}\n")
        with pytest.raises(BertkitError, match=f"pid {sleeper.pid}"):
            with staged_dir(tmp_path / "busy", owned):
                pass
    finally:
        sleeper.kill()
        sleeper.wait()
    with staged_dir(tmp_path / "busy", owned) as tmp:        # its writer is gone: a stale folder
        (tmp / "mine").write_text("1")
    assert not busy.exists()


def test_incomplete_checkpoints_are_refused_by_every_reader(tiny_model, sst_dir, tmp_path, capsys):
    from bertkit.cli import main
    from bertkit.infer import Predictor

    out = tmp_path / "run"
    finetune(cfg(data=str(sst_dir), model=str(tiny_model), out=str(out)))
    raw = json.loads((out / "config.json").read_text())
    assert "bertkit_incomplete" not in raw
    raw["bertkit_incomplete"] = "fine-tuning in progress"    # what a killed run leaves in OUT.incomplete
    (out / "config.json").write_text(json.dumps(raw))
    for reader in (lambda: load_model(out), lambda: read_config(out), lambda: Predictor.from_dir(out)):
        with pytest.raises(CheckpointError, match="unfinished run"):
            reader()
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"text": "good"}\n')
    capsys.readouterr()
    assert main(["predict", "--model", str(out), str(inp)]) == 1
    assert main(["evaluate", "--model", str(out), "--data", str(sst_dir / "dev.tsv")]) == 1
    assert main(["finetune", "--task", "sst2", "--data", str(sst_dir), "--model", str(out), "--out",
                 str(tmp_path / "o2"), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all("unfinished run" in line for line in err)
    assert not (tmp_path / "o2").exists() and not (tmp_path / "o2.incomplete").exists()


def test_rerun_replaces_every_file_and_failures_leave_nothing(tiny_model, sst_dir, conll_dir, tmp_path):
    out = tmp_path / "run"
    finetune(cfg(data=str(sst_dir), model=str(tiny_model), out=str(out)))
    assert (out / "dev_predictions.jsonl").is_file()
    # a rerun without a dev file: the old dev predictions must not survive beside the new weights
    finetune(cfg(train_file=str(sst_dir / "train.tsv"), model=str(tiny_model), out=str(out), seed=3))
    assert not (out / "dev_predictions.jsonl").exists()
    assert json.loads((out / "run_card.json").read_text())["seed"] == 3
    before = snapshot(out)
    with pytest.raises(BertkitError):                        # bad data: the previous run stays as it was
        finetune(cfg(task="conll2003", train_file=str(sst_dir / "train.tsv"), model=str(tiny_model), out=str(out)))
    assert snapshot(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    with pytest.raises(BertkitError):                        # a new folder that fails leaves no folder
        finetune(cfg(task="conll2003", train_file=str(sst_dir / "train.tsv"), model=str(tiny_model),
                     out=str(tmp_path / "x" / "y")))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "notes.txt").write_text("mine")
    with pytest.raises(BertkitError, match="holds other files"):
        finetune(cfg(data=str(sst_dir), model=str(tiny_model), out=str(tmp_path / "data")))
    assert (tmp_path / "data" / "notes.txt").read_text() == "mine"


# ---- kill -9 ------------------------------------------------------------------------------------
def check_complete(out: Path) -> dict:
    """A finished run: every file there, consistent with each other, loadable; returns its card."""
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "vocab.txt", "finetune.yaml", "metrics.json", "metrics.jsonl",
            "run_card.json", "run_card.md", "dev_predictions.jsonl"} <= names, names
    assert ".bertkit-writer" not in names
    raw = json.loads((out / "config.json").read_text())
    assert "bertkit_incomplete" not in raw
    metrics = json.loads((out / "metrics.json").read_text())
    card = json.loads((out / "run_card.json").read_text())
    assert card["best_step"] == metrics["best_step"] and card["config"]["seed"] == metrics_seed(out)
    best = max(metrics["history"], key=lambda r: r["dev_accuracy"])
    assert best["dev_accuracy"] == metrics["dev"]["accuracy"]
    load_model(out)
    return card


def metrics_seed(out: Path) -> int:
    import yaml
    return yaml.safe_load((out / "finetune.yaml").read_text())["seed"]


@pytest.mark.slow
def test_kill_9_during_a_rerun_leaves_old_or_new_never_a_mix(tiny_model, sst_dir, tmp_path):
    out = tmp_path / "run"
    args = ["finetune", "--task", "sst2", "--data", str(sst_dir), "--model", str(tiny_model), "--out", str(out),
            "--max-length", "32", "--batch-size", "16", "--lr", "2e-3", "--epochs", "4", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def start(seed: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "bertkit", *args, "--seed", str(seed)], cwd=REPO, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    t0 = time.time()
    first = start(0)
    assert first.wait(timeout=300) == 0, first.stderr.read()
    full = time.time() - t0
    assert check_complete(out)["seed"] == 0
    rng = random.Random(0)
    seen = {"old": 0, "new": 0, "staged checkpoint": 0, "complete, around the swap": 0}
    current_seed, current = 0, snapshot(out)
    staged = outdir.staging_path(out)
    for k in range(6):
        prev_seed = current_seed
        proc = start(k + 1)
        if k % 2:                                            # at a random time
            time.sleep(rng.uniform(0.1, 1.1) * full)
        else:                                                # soon after a best-so-far checkpoint is saved
            deadline = time.time() + 2 * full
            while not (staged / "config.json").is_file() and proc.poll() is None and time.time() < deadline:
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 0.05))      # the rest of a tiny run can take < 0.5 s on a fast CPU
        proc.kill()                                          # SIGKILL
        proc.wait()
        assert out.is_dir()
        if snapshot(out) == current:
            seen["old"] += 1
        else:                                                # the rerun finished before the kill
            assert check_complete(out)["seed"] == k + 1
            seen["new"] += 1
            current_seed, current = k + 1, snapshot(out)
        if (staged / "config.json").is_file():
            if "bertkit_incomplete" in json.loads((staged / "config.json").read_text()):
                with pytest.raises(CheckpointError, match="unfinished run"):     # best so far: refused
                    load_model(staged)
                seen["staged checkpoint"] += 1
            else:                       # killed in the microseconds around the swap: a complete run
                assert check_complete(staged)["seed"] in (prev_seed, k + 1)
                seen["complete, around the swap"] += 1
        assert {p.name for p in tmp_path.iterdir()} <= {"run", "run.incomplete"}
    assert seen["old"] >= 1 and seen["staged checkpoint"] >= 1, seen      # kills landed mid-run
    proc = start(99)                                         # a clean rerun clears the leftovers
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    assert check_complete(out)["seed"] == 99 and sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    print(f"kill -9 outcomes over 6 kills (full run {full:.1f} s): {seen}")
