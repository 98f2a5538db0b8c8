"""Same command, same result under the default options: every machine-dependent choice (precision,
attention kernel, padded or padding-free) is made once, recorded in the checkpoint and reused; a time
budget becomes a recorded number of updates. The runs here leave BERTKIT_BF16 / BERTKIT_ATTENTION
unset (the suite pins them elsewhere), so 'auto' measures this machine as a user's run would."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_finetune import sentiment_rows, tiny_model  # noqa: F401 (a fixture)
from test_pretrain import make_data, tiny_config
from test_pretrain_resume import _KILLED_AT, _args

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data64(tmp_path_factory) -> Path:
    return make_data(tmp_path_factory.mktemp("determinism_data"), (64,))[64]


@pytest.fixture(scope="module")
def machine(tmp_path_factory) -> dict:
    """A user's environment: no test switches, one fresh measurements file shared by the runs."""
    env = {k: v for k, v in os.environ.items() if k not in ("BERTKIT_BF16", "BERTKIT_ATTENTION")}
    return {**env, "OMP_NUM_THREADS": "1", "BERTKIT_CACHE_DIR": str(tmp_path_factory.mktemp("machine"))}


def _config(data: Path, out: Path, **more):
    # the defaults: precision, attention kernel and packing all 'auto'
    return tiny_config(data, out, **{"train.max_steps": 16, "train.checkpoint_every": 4, "train.eval_every": 8,
                                     "train.precision": "auto", "train.attention": "auto", "train.packed": "auto",
                                     **more})


def _pretrain(env: dict, args: list[str], killed_at: int | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", _KILLED_AT, str(killed_at), *args] if killed_at is not None \
        else [sys.executable, "-m", "bertkit", "pretrain", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def _weights(run: Path) -> bytes:
    return (run / "final" / "model.safetensors").read_bytes()


def _card(run: Path) -> dict:
    return json.loads((run / "run_card.json").read_text())


def test_same_command_twice_gives_identical_weights_and_records_its_choices(data64, machine, tmp_path):
    for name in ("a", "b"):
        r = _pretrain(machine, _args(_config(data64, tmp_path / name)))
        assert r.returncode == 0, r.stderr[-2000:]
    assert _weights(tmp_path / "a") == _weights(tmp_path / "b")
    card = _card(tmp_path / "a")
    recorded = json.loads((tmp_path / "a" / "final" / "config.json").read_text())["bertkit_run"]
    assert recorded == {"device": "cpu", "precision": {"float32": "fp32", "bfloat16": "bf16"}[card["precision"]],
                        "attention_kernel": card["attention_kernel"], "packed": card["packed"]}
    ckpt = sorted((tmp_path / "a" / "checkpoints").glob("step-*"))[-1]
    assert json.loads((ckpt / "trainer.json").read_text())["state"]["choices"] == recorded
    # the measurement behind 'auto' was made once, by the first process, and read by the second
    assert "measured once on this machine" in card["precision_reason"]
    assert card["deterministic"].startswith("off: the CPU path is deterministic")
    measured = json.loads((Path(machine["BERTKIT_CACHE_DIR"]) / "measurements.json").read_text())
    assert any("bf16 GEMM speedup" in k for k in measured)


def test_kill_9_anywhere_then_resume_gives_identical_weights(data64, machine, tmp_path):
    straight = tmp_path / "straight"
    assert _pretrain(machine, _args(_config(data64, straight))).returncode == 0
    crashed = tmp_path / "crashed"
    for at in (6, 11):                           # after a checkpoint (4, 8) and past it: updates are redone
        r = _pretrain(machine, _args(_config(data64, crashed, resume=at > 6)), killed_at=at)
        assert r.returncode != 0
    r = _pretrain(machine, _args(_config(data64, crashed, resume=True)))
    assert r.returncode == 0, r.stderr[-2000:]
    assert _weights(crashed) == _weights(straight)
    assert _card(crashed)["precision"] == _card(straight)["precision"]


def test_resume_keeps_the_choices_it_ran_with_and_an_explicit_change_is_recorded(data64, machine, tmp_path):
    from bertkit.runstate import saved_state

    run = tmp_path / "run"
    assert _pretrain(machine, _args(_config(data64, run, **{"train.attention": "math"})), killed_at=6).returncode != 0
    ckpt = sorted((run / "checkpoints").glob("step-*"))[-1]
    assert saved_state(ckpt)["choices"]["attention_kernel"] == "math"
    # 'auto' on resume takes the kernel the run ran with, not a new measurement
    r = _pretrain(machine, _args(_config(data64, run, resume=True, **{"train.max_steps": 8})))
    assert r.returncode == 0, r.stderr[-2000:]
    card = _card(run)
    assert card["attention_kernel"] == "math" and "as the checkpoint step-00000004 ran" in card["attention_kernel_reason"]
    assert card["choices_changed"] is None
    # asking otherwise is honoured, said, and recorded
    r = _pretrain(machine, _args(_config(data64, run, resume=True, **{"train.max_steps": 12,
                                                                     "train.attention": "sdpa"})))
    assert r.returncode == 0 and "computes otherwise" in r.stderr
    assert _card(run)["choices_changed"] == ["update 8: attention_kernel math -> sdpa"]


def test_a_time_budget_is_a_recorded_number_of_updates(data64, machine, tmp_path):
    budgeted = tmp_path / "budgeted"
    args = _args(_config(data64, budgeted, **{"train.max_steps": 10_000, "train.budget": "4s",
                                              "train.checkpoint_every": 5}))
    killed = _pretrain(machine, args, killed_at=6)           # after the plan was made and checkpointed at 5
    r = _pretrain(machine, args + ["--resume=true"])
    assert r.returncode == 0, r.stderr[-2000:]
    card = _card(budgeted)
    n = card["planned_updates"]
    assert n >= 3 and card["updates"] == n and card["stop_reason"] == f"budget: {n} updates planned"
    assert card["reproduce"].endswith(f"--train.max_steps={n} --train.budget=null")
    if killed.returncode != 0:                               # (a plan under 6 updates finished before the kill)
        assert "timed and undone" not in r.stderr            # the resume continued the recorded plan
    # the recorded number of updates without the budget: the same weights, bit for bit
    again = tmp_path / "again"
    r = _pretrain(machine, _args(_config(data64, again, **{"train.max_steps": n, "train.checkpoint_every": 5})))
    assert r.returncode == 0, r.stderr[-2000:]
    assert _weights(again) == _weights(budgeted)


def test_a_budget_does_not_change_a_run_that_max_steps_ends_first(data64, tmp_path):
    from bertkit.train import pretrain

    pretrain(tiny_config(data64, tmp_path / "steps", **{"train.max_steps": 6}))
    card = pretrain(tiny_config(data64, tmp_path / "both", **{"train.max_steps": 6, "train.budget": "5m"}))
    assert card["updates"] == 6 and card["stop_reason"] == "max_steps"
    assert _weights(tmp_path / "both") == _weights(tmp_path / "steps")


def test_the_same_finetune_command_twice_gives_identical_weights(tiny_model, machine, tmp_path):
    import csv

    for split, seed in (("train", 0), ("dev", 1)):
        with open(tmp_path / f"{split}.csv", "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows([("text", "label"), *sentiment_rows(48, seed)])
    for name in ("a", "b"):
        r = subprocess.run([sys.executable, "-m", "bertkit", "finetune", "--task", "classify",
                            "--train-file", str(tmp_path / "train.csv"), "--dev-file", str(tmp_path / "dev.csv"),
                            "--model", str(tiny_model), "--out", str(tmp_path / name), "--epochs", "2",
                            "--batch-size", "8", "--no-progress"],
                           cwd=REPO, env=machine, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    recorded = json.loads((tmp_path / "a" / "config.json").read_text())["bertkit_run"]
    assert recorded["evaluation"] == "fp32" and recorded["precision"] in ("fp32", "bf16")


def test_precision_is_one_option_on_every_command_that_runs_a_model(minilm, tmp_path, caplog):
    import logging

    import numpy as np

    from bertkit.cli import main

    sample = REPO / "src" / "bertkit" / "sample" / "sample.txt"
    vecs = {}
    for precision in ("fp32", "bf16"):
        with caplog.at_level(logging.INFO, logger="bertkit"):
            assert main(["embed", "--model", str(minilm), "--precision", precision, "--normalize",
                         "--output", str(tmp_path / f"{precision}.npy"), str(sample)]) == 0
        said = {"fp32": "precision float32: precision float32 asked for",
                "bf16": "precision bfloat16: precision bfloat16 asked for"}[precision]
        assert said in caplog.text                     # what ran is said
        vecs[precision] = np.load(tmp_path / f"{precision}.npy")
    assert (vecs["bf16"] * vecs["fp32"]).sum(-1).min() > 0.99
    import argparse                                      # the same option and values everywhere

    from bertkit.cli import build_parser
    for command in ("pretrain", "finetune", "evaluate", "predict", "embed", "fill-mask", "serve", "quickstart"):
        parser = build_parser(only=command)
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
        flag = "--train.precision" if command == "pretrain" else "--precision"   # pretrain: flag = YAML key
        option = next(a for a in sub._actions if flag in a.option_strings)
        assert set(option.choices) <= {"auto", "fp32", "bf16", "fp16"} and "auto" in option.choices, command


def test_deterministic_on_a_gpu_switches_torchs_deterministic_algorithms(monkeypatch):
    """train.deterministic / finetune --deterministic: on a GPU torch's deterministic algorithms with
    cuBLAS's fixed workspace (read when cuBLAS starts, so set first); on the CPU nothing changes."""
    import torch

    from bertkit.hardware import deterministic
    calls = []
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda on, **kw: calls.append(on))
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert deterministic(torch.device("cpu"), True).startswith("on: the CPU path is deterministic")
    assert deterministic(torch.device("cuda"), False).startswith("off: GPU atomics")
    assert calls == [] and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert deterministic(torch.device("cuda"), True) == \
        "on: torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG=:4096:8"
    assert calls == [True] and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a GPU")
def test_same_command_twice_on_a_gpu_with_deterministic_gives_identical_weights(data64, machine, tmp_path):
    for name in ("a", "b"):
        r = _pretrain(machine, _args(_config(data64, tmp_path / name, **{"train.deterministic": True})))
        assert r.returncode == 0, r.stderr[-2000:]
    assert _card(tmp_path / "a")["deterministic"].startswith("on: torch.use_deterministic_algorithms")
    assert _weights(tmp_path / "a") == _weights(tmp_path / "b")
