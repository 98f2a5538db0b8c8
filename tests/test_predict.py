"""`bertkit predict` / `evaluate` on a checkpoint: config.json is read once and handed down (to the
Predictor's loader and the task's settings), whatever the head."""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
import torch

import bertkit.checkpoint
from bertkit import Tokenizer, preset, save_model
from bertkit.checkpoint import build
from bertkit.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")    # conftest: tiny models, one thread

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "the", "movie", "was", "."]


def checkpoint(path: Path, head: str, **extra) -> Path:
    """A tiny checkpoint of `head` with its tokenizer (random weights: only the plumbing is tested)."""
    torch.manual_seed(0)
    cfg = preset("tiny", vocab_size=len(WORDS), hidden_size=32, num_heads=2, intermediate_size=64,
                 max_position_embeddings=64)
    args = {"num_labels": 2} if head == "sequence_classification" else {}
    save_model(build(head, cfg, **args), path, extra_config=extra)
    Tokenizer({t: i for i, t in enumerate(WORDS)}, lowercase=True).save(path)
    return path


@pytest.fixture
def reads(monkeypatch) -> list[Path]:
    """Every `checkpoint.read_config` call from here on, through every module that imported it."""
    calls: list[Path] = []
    real = bertkit.checkpoint.read_config

    def counted(path):
        calls.append(Path(path))
        return real(path)

    importlib.import_module("bertkit.commands.predict")     # every module on the predict path, bound first
    for module in [m for name, m in sys.modules.items() if name.startswith("bertkit")]:
        if getattr(module, "read_config", None) is real:
            monkeypatch.setattr(module, "read_config", counted)
    return calls


@pytest.mark.parametrize("head, extra, line", [
    ("sequence_classification", {"id2label": {"0": "neg", "1": "pos"}, "bertkit_task": {"name": "sst2"},
                                 "bertkit_max_length": 32}, {"text": "the movie was good"}),
    ("masked_lm", {}, {"text": "the movie was [MASK] ."}),
])
def test_predict_reads_config_json_once(tmp_path, capsys, reads, head, extra, line):
    model = checkpoint(tmp_path / "m", head, **extra)
    (tmp_path / "in.jsonl").write_text(json.dumps(line) + "\n", encoding="utf-8")
    assert main(["predict", "--model", str(model), str(tmp_path / "in.jsonl"), "--top-k", "2"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["id"] == "0" and row["prediction"]
    assert reads == [model]


def test_evaluate_reads_config_json_once(tmp_path, capsys, reads):
    model = checkpoint(tmp_path / "m", "sequence_classification", id2label={"0": "0", "1": "1"},
                       bertkit_task={"name": "sst2"}, bertkit_max_length=32)
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\nthe movie was good\t1\nbad movie\t0\n", encoding="utf-8")
    assert main(["evaluate", "--model", str(model), "--data", str(tmp_path / "dev.tsv"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["examples"] == 2
    assert reads == [model]


def test_predict_and_evaluate_options_import_no_fine_tuning():
    """`bertkit predict --help` and `evaluate --help` build their options without fine-tuning's modules
    (commands/predict.py; the column options are `tasks.plumbing.Columns`)."""
    import subprocess
    import sys

    code = ("import sys; from bertkit.cli import build_parser; build_parser('predict'); build_parser('evaluate'); "
            "print(sorted(m for m in sys.modules if m.startswith(('bertkit.finetune', 'bertkit.commands.finetune'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

