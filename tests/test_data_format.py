"""The on-disk format of prepared data: atomic shards, zero-copy reading, subsets and ranks."""
from __future__ import annotations

import json

import numpy as np
import pytest

from bertkit.data.pretraining import DataError, open_dataset, shard_name, write_shard


def _fake(out, sizes, static=False):
    out.mkdir(parents=True, exist_ok=True)
    names, counts = [], []
    for s, n in enumerate(sizes):
        r = np.random.default_rng(s)
        lens = r.integers(5, 12, n)
        ids = np.concatenate([np.r_[101, r.integers(200, 999, L - 3), 102, 999, 102][:L] for L in lens])
        arrays = {"input_ids": ids.astype(np.uint16), "offsets": np.r_[0, np.cumsum(lens)].astype(np.int64),
                  "b_start": (lens - 2).astype(np.int32), "nsp_labels": (np.arange(n) % 2).astype(np.int8),
                  "short": np.zeros(n, np.uint8)}
        if static:
            arrays["masked_lm_offsets"] = np.arange(n + 1, dtype=np.int64)
            arrays["masked_lm_positions"] = np.ones(n, np.int32)
            arrays["masked_lm_ids"] = np.full(n, 7, np.uint16)
        write_shard(out, shard_name(s), arrays, {"instances": int(n)})
        names.append(shard_name(s))
        counts.append(int(n))
    meta = {"max_length": 12, "nsp": True, "masking": "static" if static else "dynamic", "vocab_size": 1000,
            "special_ids": {"pad": 0, "unk": 100, "cls": 101, "sep": 102, "mask": 103}, "tokenizer_hash": "x",
            "config_hash": "y", "counts": {"instances": sum(counts)}, "shards": names, "shard_instances": counts}
    (out / "meta.json").write_text(json.dumps(meta))
    return out


def test_read_instances(tmp_path):
    ds = open_dataset(_fake(tmp_path / "d", [3, 5, 2], static=True))
    assert len(ds) == 10 and ds.meta["nsp"] and len(ds.shard_paths) == 3
    x = ds[4]
    assert x["index"] == 4 and x["input_ids"].dtype == np.int64 and x["input_ids"][0] == 101
    L = len(x["input_ids"])
    assert x["token_type_ids"].tolist() == [0] * (L - 2) + [1, 1]
    assert x["nsp_label"] == 1 and x["masked_lm_positions"].tolist() == [1] and x["masked_lm_ids"].tolist() == [7]
    assert ds[-1]["index"] == 9
    with pytest.raises(IndexError):
        ds[10]
    assert isinstance(ds._shard(0)["input_ids"], np.memmap)   # zero copies
    assert ds.lengths().sum() == sum(len(ds[i]["input_ids"]) for i in range(10))
    import pickle
    blob = pickle.dumps(ds)                                   # what a spawned data-loader worker gets
    assert len(blob) < 5000 and pickle.loads(blob)[4]["input_ids"].tolist() == x["input_ids"].tolist()


def test_incomplete_data_is_refused(tmp_path):
    out = _fake(tmp_path / "d", [3, 2])
    (out / "meta.json").unlink()
    with pytest.raises(DataError, match="not complete"):
        open_dataset(out)
    out = _fake(tmp_path / "e", [3, 2])
    (out / "shard-00001" / "shard.json").unlink()
    with pytest.raises(DataError, match="shard-00001"):
        open_dataset(out)


@pytest.mark.parametrize("change, says", [
    (lambda m: "{not json", "not valid JSON"), (lambda m: json.dumps([1]), "JSON object"),
    (lambda m: json.dumps({**m, "shards": ["../../etc"]}), "'shards'"),
    (lambda m: json.dumps({**m, "shard_instances": [3]}), "'shard_instances'"),
    (lambda m: json.dumps({**m, "vocab_size": "big"}), "'vocab_size'"),
    (lambda m: json.dumps({**m, "masking": "sometimes"}), "'masking'"),
    (lambda m: json.dumps({**m, "masking_config": {"mask_prob": 7}}), "'masking_config'"),
    (lambda m: json.dumps({**m, "masking_config": {"nope": 1}}), "'masking_config'"),
    (lambda m: json.dumps({**m, "max_seq_length": 12}), "max_seq_length is now max_length")])
def test_bad_meta_is_a_one_line_error(tmp_path, change, says):
    out = _fake(tmp_path / "d", [3, 2])
    meta = json.loads((out / "meta.json").read_text())
    (out / "meta.json").write_text(change(meta))
    with pytest.raises(DataError, match=says):
        open_dataset(out)
