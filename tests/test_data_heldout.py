"""Held-out documents: split before instances are built, found by pretrain, overlap measured."""
from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from bertkit.cli import main
from bertkit.data.heldout import choose_held_out, ngram_hashes, ngram_overlap
from bertkit.data.prepare import PrepareConfig, document_key, prepare
from bertkit.data.pretraining import DataError, eval_split, open_dataset
from bertkit.errors import BertkitError
from bertkit.runconfig import RunConfigError
from bertkit.tokenizer import Tokenizer

from test_pretrain import tiny_config

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "src" / "bertkit" / "sample" / "inaugural.txt.gz"


@pytest.fixture(scope="module")
def tok(minilm):
    return Tokenizer.from_dir(minilm)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """30 inaugural addresses, one file."""
    d = tmp_path_factory.mktemp("heldout_corpus")
    docs = gzip.open(SAMPLE, "rt", encoding="utf-8").read().split("\n\n")[:30]
    (d / "c.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return d / "c.txt"


@pytest.fixture(scope="module")
def data(tmp_path_factory, tok, corpus) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("heldout_data")
    cfg = PrepareConfig(max_length=64, chunk_mb=0.05, seed=3)
    prepare([str(corpus)], tok, root / "split", cfg, progress=False)                     # default: 1%, at least 2
    prepare([str(corpus)], tok, root / "none", PrepareConfig(max_length=64, chunk_mb=0.05, seed=3,
                                                             eval_fraction=0.0), progress=False)
    prepare([str(corpus)], tok, root / "static", PrepareConfig(max_length=64, chunk_mb=0.05, seed=3,
            masking="static", dupe_factor=3, eval_documents=4), progress=False)
    return {k: root / k for k in ("split", "none", "static")}


def _flat(ds) -> np.ndarray:
    return np.concatenate([np.asarray(ds._shard(s)["input_ids"], dtype=np.int64) for s in range(len(ds.shard_paths))])


def test_whole_documents_are_held_out_before_instances(tok, corpus, data):
    docs = [d.split("\n") for d in corpus.read_text(encoding="utf-8").strip().split("\n\n")]
    ds = open_dataset(data["split"])
    held = eval_split(ds)
    info = ds.meta["eval"]
    assert info["documents"] == 2 and info["of_documents"] == 30 and held.meta["counts"]["documents"] == 2
    assert ds.meta["counts"]["held_out_documents"] == 2 and held.meta["dupe_factor"] == 1
    keys = [document_key(3, d) for d in docs]
    chosen = set(np.argsort(keys)[:2].tolist())
    never = ds.token_info().never_mask
    train_grams = set(ngram_hashes(f := _flat(ds), np.isin(f, never), 12).tolist())
    held_grams = set(ngram_hashes(f := _flat(held), np.isin(f, never), 12).tolist())
    for i, d in enumerate(docs):                 # each document's longest sentence: on its own side only
        ids = np.asarray(tok.encode_ids([max(d, key=len)])[0])
        grams = set(ngram_hashes(ids, np.zeros(len(ids), bool), 12).tolist())
        assert grams, i
        inside, outside = (held_grams, train_grams) if i in chosen else (train_grams, held_grams)
        assert grams & inside and not grams & outside, i
    # the split is a prepared folder of its own, with the same tokenizer
    assert held.tokenizer().fingerprint() == tok.fingerprint() and len(held) == info["instances"] > 20


def test_split_is_deterministic_resumable_and_cluster_safe(tok, corpus, data, tmp_path):
    cfg = PrepareConfig(max_length=64, chunk_mb=0.05, seed=3)
    prepare([str(corpus)], tok, tmp_path / "w2", cfg, workers=2, progress=False)

    def npy(out):
        return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*.npy"))}
    assert npy(tmp_path / "w2") == npy(data["split"]) and any(k.startswith("eval/") for k in npy(data["split"]))
    again = prepare([str(corpus)], tok, tmp_path / "w2", cfg, progress=False)
    assert again["counts"]["shards_kept_from_before"] == len(again["shards"]) + len(eval_split(open_dataset(
        tmp_path / "w2")).shard_paths)
    for part in range(2):
        prepare([str(corpus)], tok, tmp_path / "c", cfg, num_shards=2, shard_index=part, progress=False)
    assert npy(tmp_path / "c") == npy(data["split"]) and len(eval_split(open_dataset(tmp_path / "c"))) == \
        len(eval_split(open_dataset(data["split"])))
    # no split this time: the old one goes
    m = prepare([str(corpus)], tok, tmp_path / "w2", PrepareConfig(max_length=64, chunk_mb=0.05, seed=3,
                                                                    eval_documents=0), progress=False)
    assert m["eval"] is None and not (tmp_path / "w2" / "eval").exists()
    # too few documents for the default: no split, and a word about it
    small = tmp_path / "small.txt"
    small.write_text("\n\n".join(corpus.read_text(encoding="utf-8").split("\n\n")[:5]), encoding="utf-8")
    assert prepare([str(small)], tok, tmp_path / "s", cfg, progress=False)["eval"] is None
    assert prepare([str(small)], tok, tmp_path / "s", PrepareConfig(max_length=64, eval_documents=2),
                   progress=False)["eval"]["documents"] == 2
    with pytest.raises(BertkitError, match="at least 2 must stay"):
        prepare([str(small)], tok, tmp_path / "s2", PrepareConfig(eval_documents=4), progress=False)
    with pytest.raises(BertkitError, match="eval_documents 1"):
        PrepareConfig(eval_documents=1)
    with pytest.raises(BertkitError, match="eval_fraction"):
        PrepareConfig(eval_fraction=1.0)


def test_overlap_tells_a_document_split_from_training_instances(data):
    ds = open_dataset(data["split"])
    held = choose_held_out(ds, None, 256)
    split = ngram_overlap(held, [(ds, held.train_stop)])["overlap"]
    ds = open_dataset(data["none"])
    held = choose_held_out(ds, None, 256)
    assert held.source == "last_instances" and held.train_stop == len(ds) - len(held.indices)
    last = ngram_overlap(held, [(ds, held.train_stop)])["overlap"]
    ds = open_dataset(data["static"])                 # 3 copies of the training text, masks undone
    held = choose_held_out(ds, None, 256)
    static_split = ngram_overlap(held, [(ds, held.train_stop)])["overlap"]
    assert split < 0.02 and static_split < 0.02 and last > 0.08, (split, static_split, last)
    ds = open_dataset(data["none"])                   # over the token budget: a sample, the held-out shard whole
    held = choose_held_out(ds, None, 256)
    part = ngram_overlap(held, [(ds, held.train_stop)], max_train_tokens=1000)
    assert part["sampled"] and part["train_tokens_scanned"] < part["train_tokens"] and part["overlap"] > 0.08
    ds = open_dataset(data["static"])
    whole = choose_held_out(ds, str(data["static"]), 256)   # the training data as its own held-out set
    assert ngram_overlap(whole, [(ds, whole.train_stop)])["overlap"] > 0.99


def test_data_stats_reports_the_overlap(data, capsys):
    assert main(["data", "stats", str(data["split"]), "--json", "--sample", "200"]) == 0
    h = json.loads(capsys.readouterr().out)["held_out"]
    assert h["source"] == "split" and h["split"]["documents"] == 2 and h["overlap"] < 0.05
    assert main(["data", "stats", str(data["none"]), "--sample", "200"]) == 0
    assert "mask leakage" in capsys.readouterr().out


def test_pretrain_evaluates_on_the_split(data, tmp_path, caplog):
    from bertkit.train import pretrain

    card = pretrain(tiny_config(data["split"], tmp_path / "a", **{"train.max_steps": 2, "train.eval_every": 0}))
    h = card["held_out"]
    assert h["source"] == "split" and h["path"].endswith("eval") and h["overlap"] < 0.05 and h["ngram"] == 12
    assert card["final_eval"]["eval_predictions"] > 0
    assert "| held-out set | split: " in (tmp_path / "a" / "run_card.md").read_text()
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        card = pretrain(tiny_config(data["none"], tmp_path / "b", **{"train.max_steps": 2, "train.eval_every": 0}))
    assert card["held_out"]["source"] == "last_instances" and card["held_out"]["overlap"] > 0.08
    assert "NO HELD-OUT DOCUMENTS" in caplog.text and "mask leakage" in caplog.text
    with pytest.raises(RunConfigError, match="mask leakage"):
        pretrain(tiny_config(data["split"], tmp_path / "c", **{"data.eval_path": str(data["split"]),
                                                               "train.max_steps": 1}))
    with pytest.raises(DataError, match="another tokenizer"):
        from bertkit.data.heldout import choose_held_out as choose
        other = tmp_path / "other"
        other.mkdir()
        (other / "meta.json").write_text(json.dumps({**open_dataset(data["split"]).meta, "tokenizer_hash": "x"}))
        for s in open_dataset(data["split"]).shard_paths:
            (other / s.name).symlink_to(s)
        choose(open_dataset(data["split"]), str(other), 8)
