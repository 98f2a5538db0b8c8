"""`bertkit quickstart`: tokenizer, prepared data, a short pre-training run and its report, end to end."""
from __future__ import annotations

import json

from bertkit.cli import main


def test_quickstart_runs_end_to_end(tmp_path, capsys):
    out = tmp_path / "qs"
    assert main(["quickstart", "--out", str(out), "--minutes", "0.1", "--vocab-size", "2000"]) == 0
    text = capsys.readouterr().out
    assert "held-out MLM accuracy:" in text and "fill-mask (top 3):" in text
    card = json.loads((out / "run" / "run_card.json").read_text())
    assert card["stop_reason"] == "budget" and card["updates"] >= 1
    assert card["config"]["data"]["eval_path"].endswith("heldout")
    evals = [json.loads(x) for x in (out / "run" / "eval.jsonl").read_text().splitlines()]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == card["updates"]
    assert evals[-1]["eval_mlm_loss"] < evals[0]["eval_mlm_loss"]            # it learned something
    for f in ("tokenizer/vocab.txt", "data/train/meta.json", "data/heldout/meta.json", "run/curves.png",
              "run/run_card.md", "run/final/model.safetensors", "run/final/vocab.txt"):
        assert (out / f).exists(), f
