"""What a person reads from a pre-training run: a bar only on a terminal, a status line in logs,
no "s/s" units, and a plot that says what it is a plot of."""
from __future__ import annotations

import io
import json
import logging
import math
from types import SimpleNamespace

import pytest

from bertkit import runlog


def _cfg(budget=None, max_steps=200):
    return SimpleNamespace(train=SimpleNamespace(progress=True, budget=budget, max_steps=max_steps))


MAIN = SimpleNamespace(main=True)


def test_no_bar_in_a_pipe_but_a_periodic_status_line(monkeypatch, caplog):
    monkeypatch.setattr(runlog, "_on_terminal", lambda: False)
    bar = runlog.progress_bar(_cfg(), SimpleNamespace(step=10, elapsed=0.0), MAIN, 200)
    assert isinstance(bar, runlog.StatusLine)
    bar.every = 0.0                                  # log at every update
    bar.set_postfix({"loss": "6.912", "tok/s": "1500"})
    with caplog.at_level(logging.INFO, logger="bertkit"):
        bar.update(1)
        bar.write("update 11: held-out MLM loss 7.0")
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("pretrain: update 11/200 (6%), ") and lines[0].endswith("loss 6.912, tok/s 1500")
    assert lines[1] == "update 11: held-out MLM loss 7.0"
    off = SimpleNamespace(train=SimpleNamespace(progress=False, budget=None, max_steps=5))
    assert runlog.progress_bar(off, SimpleNamespace(step=0, elapsed=0.0), MAIN, 5) is None


def test_terminal_bar_counts_the_updates_of_the_run(monkeypatch):
    # a time budget is a planned number of updates too (train.plan_budget): one kind of bar
    pytest.importorskip("tqdm")
    monkeypatch.setattr(runlog, "_on_terminal", lambda: True)
    bar = runlog.progress_bar(_cfg("3m"), SimpleNamespace(step=0, elapsed=0.0), MAIN, 180)
    out = io.StringIO()
    bar.fp = out
    bar.update(1)
    text = str(bar)
    bar.close()
    assert "s/s" not in text and "update/s" not in text
    assert "update 1/180" in text


def test_plot_has_a_title_with_run_model_tokens_and_machine(tmp_path):
    pytest.importorskip("matplotlib")
    metrics = [{"step": s, "loss": 9 - math.log1p(s), "mlm_loss": 8.5 - math.log1p(s), "mlm_accuracy": 0.01 * s,
                "nsp_accuracy": None, "lr": 1e-4, "tokens": 4096 * s} for s in range(1, 40)]
    evals = [{"step": s, "eval_mlm_loss": 9 - math.log1p(s), "eval_mlm_accuracy": 0.01 * s, "eval_nsp_accuracy": None}
             for s in range(0, 40, 5)]
    card = {"name": "quick", "model": "tiny: 2 layers, hidden 128", "parameters": 1_528_130, "tokens_seen": 159_744,
            "updates": 39, "wall_time_s": 12.3, "hardware": {"cpu": "Some CPU 9000", "torch_threads": 2}}
    (tmp_path / "run_card.json").write_text(json.dumps(card))
    assert runlog.plot_curves(metrics, evals, tmp_path / "curves.png") == tmp_path / "curves.png"
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    title = runlog.plot_title(card, tmp_path / "curves.png", metrics)
    for part in ("run quick", "tiny: 2 layers", "1.5 M parameters", "159,744 tokens", "39 updates", "Some CPU 9000"):
        assert part in title


def test_tensorboard_scalars_are_named_by_group_without_its_prefix():
    """Training and evaluation records reach TensorBoard the same way: numbers only, `step` as the x
    axis, eval_mlm_loss as eval/mlm_loss; keys without the prefix keep their name (eval/elapsed_s,
    which an `eval/{key[5:]}` once wrote as eval/sed_s)."""
    got = []
    board = SimpleNamespace(add_scalar=lambda tag, v, step: got.append((tag, v, step)))
    runlog.to_board(board, "eval", {"step": 7, "eval_mlm_loss": 2.5, "eval_nsp_accuracy": None,
                                    "elapsed_s": 3.0, "tokens": 640}, 7)
    runlog.to_board(board, "train", {"step": 8, "loss": 2.0, "phase": "long"}, 8)
    runlog.to_board(None, "train", {"step": 9, "loss": 1.0}, 9)           # no writer: nothing
    assert got == [("eval/mlm_loss", 2.5, 7), ("eval/elapsed_s", 3.0, 7), ("eval/tokens", 640, 7),
                   ("train/loss", 2.0, 8)]
