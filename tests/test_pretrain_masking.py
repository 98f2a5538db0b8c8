"""What `prepare` recorded about masking is what training does (and what `data stats` measures)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from bertkit.data.masking import MaskingConfig
from bertkit.data.prepare import PrepareConfig, prepare
from bertkit.data.pretraining import open_dataset
from bertkit.data.stats import data_stats
from bertkit.distributed import World
from bertkit.runconfig import RunConfigError
from bertkit.tokenizer import Tokenizer

from test_pretrain import tiny_config

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "src" / "bertkit" / "sample" / "inaugural.txt.gz"
VARIANTS = {
    "token": MaskingConfig(),
    "mask100": MaskingConfig(mask_token_fraction=1.0, random_token_fraction=0.0),
    "keep100": MaskingConfig(mask_token_fraction=0.0, random_token_fraction=0.0),
    "random100": MaskingConfig(mask_token_fraction=0.0, random_token_fraction=1.0),
    "whole_word": MaskingConfig(mode="whole_word"),
    "span": MaskingConfig(mode="span", span_p=0.3, max_span=6),
    "p30": MaskingConfig(mask_prob=0.3, max_predictions=40),
}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, minilm) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("masking_data")
    docs = gzip.open(SAMPLE, "rt", encoding="utf-8").read().split("\n\n")[:14]
    (root / "c.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    tok = Tokenizer.from_dir(minilm)
    out = {}
    for name, mc in VARIANTS.items():
        prepare([str(root / "c.txt")], tok, root / name, PrepareConfig(max_length=64, masking_config=mc),
                progress=False)
        out[name] = root / name
    prepare([str(root / "c.txt")], tok, root / "static", PrepareConfig(max_length=64, masking="static",
            dupe_factor=1, masking_config=VARIANTS["mask100"]), progress=False)
    out["static"] = root / "static"
    return out


def training_batch(data: Path, tmp_path: Path, **keys) -> tuple[dict, dict]:
    """64 instances through the collator that train.phases.build_phases builds for this data and config."""
    from bertkit.train.phases import build_phases

    phases, tok = build_phases(tiny_config(data, tmp_path / "run", **keys), World())
    ph = phases[0]
    batch = ph.collator([ph.data[int(i)] for i in ph.indices[:64]], epoch=0)
    return {k: v.numpy() for k, v in batch.items()}, {"mask_id": tok.mask_id, "subword": ph.collator.info.subword}


def selected(b: dict) -> np.ndarray:
    return b["mlm_labels"] != -100


def test_replacement_fractions_reach_the_batches(prepared, tmp_path):
    b, t = training_batch(prepared["mask100"], tmp_path)
    sel = selected(b)
    assert sel.sum() > 300 and (b["input_ids"][sel] == t["mask_id"]).all()
    b, t = training_batch(prepared["keep100"], tmp_path)
    sel = selected(b)
    assert sel.sum() > 300 and (b["input_ids"][sel] == b["mlm_labels"][sel]).all()
    b, t = training_batch(prepared["random100"], tmp_path)
    sel = selected(b)
    assert (b["input_ids"][sel] != t["mask_id"]).all() and (b["input_ids"][sel] != b["mlm_labels"][sel]).mean() > 0.9
    b, _ = training_batch(prepared["token"], tmp_path)
    shown = b["input_ids"][selected(b)]
    assert 0.7 < (shown == t["mask_id"]).mean() < 0.9                       # 80/10/10


def test_mask_prob_and_cap_reach_the_batches(prepared, tmp_path):
    def rate(b):
        real = (b["attention_mask"] == 1) & ~np.isin(b["input_ids"], [101, 102])
        return selected(b).sum() / (real.sum() + 0.0)
    assert abs(rate(training_batch(prepared["token"], tmp_path)[0]) - 0.15) < 0.02
    assert abs(rate(training_batch(prepared["p30"], tmp_path)[0]) - 0.30) < 0.02
    b, _ = training_batch(prepared["p30"], tmp_path, **{"data.max_predictions": 5})     # an override
    assert selected(b).sum(1).max() == 5


def _word_split(b: dict, subword: np.ndarray) -> int:
    """Selected word pieces whose word-mate right before them is not selected (or vice versa)."""
    orig = np.where(selected(b), b["mlm_labels"], b["input_ids"])
    sel = selected(b)
    cont = subword[orig[:, 1:]] & (b["attention_mask"][:, 1:] == 1)            # piece j+1 continues piece j
    return int((cont & (sel[:, 1:] != sel[:, :-1])).sum())


def _mean_run(b: dict) -> float:
    sel = selected(b).astype(np.int8)
    starts = ((np.diff(sel, axis=1, prepend=0)) == 1).sum()
    return sel.sum() / max(starts, 1)


def test_whole_word_and_span_reach_the_batches(prepared, tmp_path):
    b, t = training_batch(prepared["whole_word"], tmp_path)
    assert _word_split(b, t["subword"]) == 0
    token, _ = training_batch(prepared["token"], tmp_path)
    assert _word_split(token, t["subword"]) > 0                                # the check can fail
    span, _ = training_batch(prepared["span"], tmp_path)
    assert _mean_run(span) > 2.0 > 1.5 > _mean_run(token)
    # an override of the mode reaches the batches too
    b, t = training_batch(prepared["token"], tmp_path, **{"data.mask_mode": "whole_word"})
    assert _word_split(b, t["subword"]) == 0


def test_static_data_refuses_a_changed_masking(prepared, tmp_path):
    b, t = training_batch(prepared["static"], tmp_path, **{"data.mask_token_fraction": 1.0})   # = prepared: fine
    assert (b["input_ids"][selected(b)] == t["mask_id"]).all()
    with pytest.raises(RunConfigError, match="static masks.*data.mask_prob=0.3"):
        training_batch(prepared["static"], tmp_path, **{"data.mask_prob": 0.3})
    with pytest.raises(RunConfigError, match="mask_token_fraction"):
        training_batch(prepared["keep100"], tmp_path, **{"data.random_token_fraction": 0.5,
                                                         "data.mask_token_fraction": 0.8})


def test_data_stats_measures_what_training_does(prepared, tmp_path):
    for name, frac in (("mask100", "mask_fraction"), ("keep100", "keep_fraction"), ("static", "mask_fraction")):
        m = data_stats(open_dataset(prepared[name]), sample=300)["masking"]
        assert m[frac] == 1.0 and m["config"] == VARIANTS["mask100" if name == "static" else name].to_dict()
    m = data_stats(open_dataset(prepared["p30"]), sample=300)["masking"]
    assert abs(m["selected_fraction"] - 0.3) < 0.02


def test_run_card_records_masking_as_trained_and_overrides(prepared, tmp_path):
    from bertkit.train import pretrain

    card = pretrain(tiny_config(prepared["mask100"], tmp_path / "run", **{
        "train.max_steps": 2, "train.eval_every": 0, "data.random_token_fraction": 0.2,
        "data.mask_token_fraction": 0.7}))
    (m,) = card["masking"]
    assert m["as_trained"]["mask_token_fraction"] == 0.7 and m["prepared"]["mask_token_fraction"] == 1.0
    assert m["overridden"] == {"mask_token_fraction": {"prepared": 1.0, "trained": 0.7},
                               "random_token_fraction": {"prepared": 0.0, "trained": 0.2}}
    assert json.loads((tmp_path / "run" / "run_card.json").read_text())["masking"] == card["masking"]
    assert "overridden: mask_token_fraction 1.0 -> 0.7" in (tmp_path / "run" / "run_card.md").read_text()
    card = pretrain(tiny_config(prepared["whole_word"], tmp_path / "run2", **{"train.max_steps": 1,
                                                                              "train.eval_every": 0}))
    assert card["masking"][0]["as_trained"]["mode"] == "whole_word" and card["masking"][0]["overridden"] == {}
