"""`train.objective: clm`: a left-to-right model (the paper's "LTR & No NSP" baseline) from the CLI."""
from __future__ import annotations

import gzip
import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.runconfig import PretrainConfig, RunConfigError, load_config

from test_pretrain import tiny_config


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """The inaugural addresses with a 1000-word vocabulary: packed text (no NSP) and static NSP pairs."""
    from bertkit import Tokenizer
    from bertkit.data.masking import MaskingConfig
    from bertkit.data.prepare import PrepareConfig, prepare

    root = tmp_path_factory.mktemp("clm_data")
    raw = root / "inaugural.txt"
    raw.write_bytes(gzip.decompress((resources.files("bertkit") / "sample" / "inaugural.txt.gz").read_bytes()))
    tok = Tokenizer.train([str(raw)], vocab_size=1000)
    prepare([str(raw)], tok, root / "packed", PrepareConfig(max_length=64, nsp=False), progress=False)
    prepare([str(raw)], tok, root / "static", PrepareConfig(max_length=64, masking="static", dupe_factor=1,
            masking_config=MaskingConfig(mask_token_fraction=1.0, random_token_fraction=0.0)), progress=False)
    return {"packed": root / "packed", "static": root / "static"}


def test_collator_next_token_labels(data):
    from bertkit.data.masking import Collator
    from bertkit.data.pretraining import open_dataset

    for name in ("packed", "static"):
        ds = open_dataset(data[name])
        items = [ds[i] for i in range(6)]
        b = Collator(ds, objective="clm")(items, epoch=0)
        for r, x in enumerate(items):
            ids = x["input_ids"].copy()
            if "masked_lm_positions" in x:               # static masks are undone: the model reads the text
                ids[x["masked_lm_positions"]] = x["masked_lm_ids"]
            n = len(ids)
            assert b["input_ids"][r, :n].tolist() == ids.tolist()
            assert b["mlm_labels"][r, :n - 1].tolist() == ids[1:].tolist()
            assert (b["mlm_labels"][r, n - 1:] == -100).all()
        assert not (b["input_ids"] == ds.token_info().mask_id).any()


def test_config_objective_and_attention_agree():
    assert load_config(PretrainConfig, None, ["--model.causal=true"]).train.objective == "clm"
    assert load_config(PretrainConfig, None, ["--train.objective=clm"]).model.causal is True
    cfg = load_config(PretrainConfig, None, [])
    assert (cfg.train.objective, cfg.model.causal) == ("mlm", False)
    with pytest.raises(RunConfigError, match="needs causal attention"):
        load_config(PretrainConfig, None, ["--train.objective=clm", "--model.causal=false"])
    with pytest.raises(RunConfigError, match="train.objective=clm"):
        load_config(PretrainConfig, None, ["--train.objective=mlm", "--model.causal=true"])
    with pytest.raises(RunConfigError, match="train.objective: 'ltr' is not one of mlm, clm"):
        load_config(PretrainConfig, None, ["--train.objective=ltr"])


def _states(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.bert(ids, torch.zeros_like(ids), torch.ones_like(ids))


def test_clm_run_learns_left_to_right_and_fine_tunes_causal(data, tmp_path):
    from bertkit.checkpoint import load_model
    from bertkit.sources import read_jsonl
    from bertkit.train import pretrain

    card = pretrain(tiny_config(data["packed"], tmp_path / "ltr", **{
        "train.objective": "clm", "train.max_steps": 30, "train.eval_every": 15, "train.checkpoint_every": 0}))
    out = tmp_path / "ltr"
    assert card["objective"].startswith("CLM") and card["attention"].startswith("causal")
    assert card["config"]["train"]["nsp"] is False and card["config"]["model"]["causal"] is True
    evals = read_jsonl(out / "eval.jsonl")
    assert not any(k.startswith("eval_mlm") for k in evals[0])
    # it learns: held-out next-token loss falls well below its start (log V = 6.9)
    assert evals[-1]["eval_next_token_loss"] < evals[0]["eval_next_token_loss"] - 0.5
    assert evals[-1]["eval_next_token_accuracy"] > evals[0]["eval_next_token_accuracy"]
    assert "next_token_loss" in read_jsonl(out / "metrics.jsonl")[0] and (out / "curves.png").exists()
    assert json.loads((out / "final" / "config.json").read_text())["bertkit_causal"] is True
    # the contract: a token's state ignores what comes after it, and fine-tuning keeps the mask
    ltr = load_model(out / "final", head="pretraining").eval()
    mlm_card = pretrain(tiny_config(data["packed"], tmp_path / "mlm", **{"train.max_steps": 2,
                                                                         "train.eval_every": 0}))
    assert mlm_card["attention"] == "bidirectional" and mlm_card["objective"] == "MLM"
    bi = load_model(tmp_path / "mlm" / "final", head="pretraining").eval()
    ids = torch.randint(5, 1000, (1, 24), generator=torch.Generator().manual_seed(0))
    other = ids.clone()
    other[0, 12:] = torch.randint(5, 1000, (12,), generator=torch.Generator().manual_seed(1))
    for model, causal in ((ltr, True), (bi, False)):
        change = (_states(model, ids) - _states(model, other))[0, :12].abs().max().item()
        assert (change < 1e-5) if causal else (change > 1e-3), (causal, change)
    clf = load_model(out / "final", head="sequence_classification", num_labels=2, new_head_ok=True).eval()
    assert clf.config.causal and all(m.causal for m in clf.modules() if hasattr(m, "causal"))


def test_clm_refuses_masking_keys_and_runs_from_the_cli(data, tmp_path, capsys):
    from bertkit.cli import main
    from bertkit.train import pretrain

    with pytest.raises(RunConfigError, match="masks nothing"):
        pretrain(tiny_config(data["packed"], tmp_path / "x", **{"train.objective": "clm", "data.mask_prob": 0.2}))
    code = main(["pretrain", "--out", str(tmp_path / "cli"), f"--data.path={data['static']}", "--model.preset=tiny",
                 "--model.causal=true", "--train.max_steps=2", "--train.batch_size=4", "--train.progress=false",
                 "--train.eval_every=0", "--data.eval_instances=8", "--train.threads=1"])
    assert code == 0
    card = json.loads((tmp_path / "cli" / "run_card.json").read_text())
    assert card["objective"].startswith("CLM") and "eval_next_token_accuracy" in card["final_eval"]
