"""bertkit convert: Google's TensorFlow checkpoints read without TensorFlow (bertkit.checkpoint.tfckpt), converted
through the checkpoint package's one name table, equal to transformers' own conversion.

Two sources of checkpoints: tests/data/google_tf_checkpoint/ holds one that TensorFlow wrote and
transformers 4's load_tf_weights_in_bert converted (make.py there remakes both); and `write_bundle`
below writes the format from its description (tensor_bundle.proto, LevelDB's table_format.md) for
the cases the fixture does not cover: several data blocks and shards, big-endian data, bfloat16,
broken files.
"""
from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.checkpoint.tfckpt import Checkpoint, crc32c, unmask
from bertkit.cli import main

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "data" / "google_tf_checkpoint"
RELEASE = FIXTURE / "uncased_L-2_H-16_A-2"
_spec = importlib.util.spec_from_file_location("google_fixture", FIXTURE / "make.py")
google_fixture = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(google_fixture)


# ---- a tensor-bundle writer, written from the format's description ----------------------------------
_CRC_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC_TABLE.append(_c)


def _crc(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _mask(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _pb(*fields) -> bytes:
    """A protobuf message from (number, value) pairs: int -> varint, bytes -> length-delimited,
    ('fixed32', v) -> 4 bytes; zeros left out as proto3 does."""
    out = b""
    for number, value in fields:
        if isinstance(value, tuple):
            out += _uvarint(number << 3 | 5) + struct.pack("<I", value[1])
        elif isinstance(value, bytes):
            out += _uvarint(number << 3 | 2) + _uvarint(len(value)) + value
        elif value:
            out += _uvarint(number << 3) + _uvarint(value)
    return out


def _block(entries: list[tuple[bytes, bytes]], restart_every: int) -> bytes:
    out, restarts, last = b"", [], b""
    for i, (key, value) in enumerate(entries):
        shared = 0
        if i % restart_every == 0:
            restarts.append(len(out))
        else:
            while shared < min(len(key), len(last)) and key[shared] == last[shared]:
                shared += 1
        out += _uvarint(shared) + _uvarint(len(key) - shared) + _uvarint(len(value)) + key[shared:] + value
        last = key
    restarts = restarts or [0]
    return out + b"".join(struct.pack("<I", r) for r in restarts) + struct.pack("<I", len(restarts))


_CODES = {"float32": 1, "int32": 3, "int64": 9, "float16": 19, "bfloat16": 14}


def write_bundle(prefix: Path, tensors: dict, shards: int = 1, big_endian: bool = False,
                 per_block: int = 7, restart_every: int = 3) -> None:
    """A TF checkpoint: tensors (numpy arrays; ('bfloat16', float32 array) for bf16) spread over
    `shards` data files, the index in blocks of `per_block` entries."""
    order = ">" if big_endian else "<"
    data = [b""] * shards
    entries = {}
    for i, (name, arr) in enumerate(sorted(tensors.items())):
        kind, arr = arr if isinstance(arr, tuple) else (arr.dtype.name, arr)
        if kind == "bfloat16":
            raw = (arr.astype(np.float32).view(np.uint32) >> 16).astype(order + "u2").tobytes()
        else:
            raw = arr.astype(arr.dtype.newbyteorder(order)).tobytes()
        shard = i % shards
        shape = _pb(*[(2, _pb((1, d))) for d in arr.shape])
        entries[name.encode()] = _pb((1, _CODES[kind]), (2, shape), (3, shard), (4, len(data[shard])),
                                     (5, len(raw)), (6, ("fixed32", _mask(_crc(raw)))))
        data[shard] += raw
    for shard, raw in enumerate(data):
        Path(f"{prefix}.data-{shard:05d}-of-{shards:05d}").write_bytes(raw)
    header = _pb((1, shards), (2, int(big_endian)), (3, _pb((1, 1))))
    items = [(b"", header)] + sorted(entries.items())
    out, index = b"", []
    for start in range(0, len(items), per_block):
        chunk = items[start:start + per_block]
        block = _block(chunk, restart_every)
        index.append((chunk[-1][0], _uvarint(len(out)) + _uvarint(len(block))))
        out += block + b"\0" + struct.pack("<I", _mask(_crc(block + b"\0")))

    def add(block: bytes) -> bytes:
        nonlocal out
        handle = _uvarint(len(out)) + _uvarint(len(block))
        out += block + b"\0" + struct.pack("<I", _mask(_crc(block + b"\0")))
        return handle
    meta = add(_block([], 1))
    idx = add(_block(index, 1))
    footer = (meta + idx).ljust(40, b"\0") + struct.pack("<Q", 0xDB4775248B80FB57)
    Path(f"{prefix}.index").write_bytes(out + footer)


def google_release(folder: Path, rng: np.random.Generator, cfg: dict | None = None, slots: bool = True) -> dict:
    """A Google-style release folder (weights, Adam slots, global_step, bert_config.json, vocab.txt)
    written by write_bundle; returns the arrays by TF name."""
    cfg = cfg or dict(google_fixture.CONFIG, hidden_size=8, intermediate_size=12, num_hidden_layers=3)
    arrays = {n: rng.normal(0, 0.5, s).astype(np.float32) for n, s in google_fixture.google_names(cfg).items()}
    tensors = dict(arrays)
    if slots:
        tensors.update({f"{n}/adam_m": np.zeros_like(a) for n, a in list(arrays.items())[:5]})
    tensors["global_step"] = np.array(1000, dtype=np.int64)
    folder.mkdir(parents=True, exist_ok=True)
    write_bundle(folder / "bert_model.ckpt", tensors)
    (folder / "bert_config.json").write_text(json.dumps(cfg))
    (folder / "vocab.txt").write_text("".join(t + "\n" for t in google_fixture.VOCAB))
    return arrays


def load_like_transformers4(model, arrays: dict) -> None:
    """transformers 4's load_tf_weights_in_bert (gone from transformers 5), step for step, from numpy."""
    for name, array in arrays.items():
        parts = name.split("/")
        if any(p in ("adam_v", "adam_m", "AdamWeightDecayOptimizer", "global_step") for p in parts):
            continue
        pointer = model
        for m_name in parts:
            scope = re.split(r"_(\d+)", m_name) if re.fullmatch(r"[A-Za-z]+_\d+", m_name) else [m_name]
            if scope[0] in ("kernel", "gamma", "output_weights"):
                pointer = pointer.weight
            elif scope[0] in ("output_bias", "beta"):
                pointer = pointer.bias
            else:
                pointer = getattr(pointer, scope[0])
            if len(scope) >= 2:
                pointer = pointer[int(scope[1])]
        if m_name.endswith("_embeddings"):
            pointer = pointer.weight
        elif m_name == "kernel":
            array = np.transpose(array)
        assert tuple(pointer.shape) == array.shape, name
        pointer.data = torch.from_numpy(np.ascontiguousarray(array))


def outputs(model, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (3, 11), generator=g)
    types = torch.randint(0, cfg.type_vocab_size, (3, 11), generator=g)
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, 7:] = 0
    with torch.no_grad():
        out = model(input_ids=ids, token_type_ids=types, attention_mask=mask)
    if isinstance(out, dict) and "mlm_logits" in out:
        return out["mlm_logits"], out["nsp_logits"]
    return out.prediction_logits, out.seq_relationship_logits


def convert(args: list[str], capsys) -> tuple[int, str, str]:
    rc = main(["convert", *args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


# ---- the reader ---------------------------------------------------------------------------------
def test_crc32c_known_value_and_every_size():
    assert crc32c(b"123456789") == 0xE3069283                  # the CRC-32C check value
    rng = np.random.default_rng(0)
    for n in (0, 1, 63, 4096, 4099, 70_001):                   # the serial and the many-lane paths
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert crc32c(data) == _crc(data) == crc32c(np.frombuffer(data, np.uint8)), n
    assert unmask(_mask(0xE3069283)) == 0xE3069283


def test_reads_the_checkpoint_tensorflow_wrote():
    ckpt = Checkpoint(RELEASE / "bert_model.ckpt")
    ckpt.check_shards()
    shapes = google_fixture.google_names(google_fixture.CONFIG)
    assert len(ckpt.names()) == 3 * len(shapes) + 1               # weights, adam_m, adam_v, global_step
    for name, shape in shapes.items():
        assert ckpt.entry(name).shape == shape and ckpt.entry(name).dtype == "float32"
        assert np.all(ckpt.read(name + "/adam_m") == 0.25)
    assert ckpt.read("global_step").dtype == np.int64 and ckpt.read("global_step") == 0
    from safetensors.numpy import load_file
    hf = load_file(FIXTURE / "transformers4" / "model.safetensors")
    np.testing.assert_array_equal(ckpt.read("bert/embeddings/word_embeddings"),
                                  hf["bert.embeddings.word_embeddings.weight"])
    np.testing.assert_array_equal(ckpt.read("bert/encoder/layer_1/intermediate/dense/kernel").T,
                                  hf["bert.encoder.layer.1.intermediate.dense.weight"])


def test_reader_follows_the_format_description(tmp_path):
    """Several index blocks and restart points, three shards, big-endian bytes, bf16 / f16 / int32."""
    rng = np.random.default_rng(1)
    tensors = {f"v/{i:03d}/{'x' * (i % 4)}": rng.normal(size=(i % 3 + 1, 5)).astype(np.float32) for i in range(40)}
    tensors.update({"h": rng.normal(size=7).astype(np.float16), "n": np.arange(-3, 9, dtype=np.int32),
                    "b": ("bfloat16", np.array([1.5, -2.0, 0.15625, 2.0 ** 100], np.float32)), "s": np.array(4.0, np.float32)})
    for big in (False, True):
        write_bundle(tmp_path / f"m{big}", tensors, shards=3, big_endian=big)
        ckpt = Checkpoint(tmp_path / f"m{big}")
        ckpt.check_shards()
        assert ckpt.names() == sorted(tensors)
        for name, arr in tensors.items():
            if isinstance(arr, tuple):
                np.testing.assert_array_equal(ckpt.read(name), arr[1])      # these bf16 values are exact
            else:
                got = ckpt.read(name)
                assert got.dtype == arr.dtype and got.shape == np.shape(arr)
                np.testing.assert_array_equal(got, arr)


# ---- the conversion -----------------------------------------------------------------------------
def test_converted_equals_transformers_conversion(tmp_path, capsys):
    """TensorFlow's own checkpoint: bertkit's folder equals transformers 4's load_tf_weights_in_bert
    (in the fixture) weight for weight, and in transformers 5 and bertkit the outputs agree to 1e-5."""
    from safetensors.torch import load_file
    from transformers import BertForPreTraining

    from bertkit.checkpoint import load_model

    rc, out, err = convert([str(RELEASE), "--out", str(tmp_path / "out")], capsys)
    assert rc == 0, err
    assert "46 weights, 93 optimizer slots and counters left out, checksums verified" in out
    assert "BertForPreTraining" in out and "masked_lm, nsp" in out and "lower-cased" in out
    ours = load_file(tmp_path / "out" / "model.safetensors")
    theirs = load_file(FIXTURE / "transformers4" / "model.safetensors")
    tied = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    assert set(ours) == set(theirs) - tied
    for k, t in ours.items():
        torch.testing.assert_close(t, theirs[k], rtol=0, atol=0, msg=k)
    reference = BertForPreTraining.from_pretrained(FIXTURE / "transformers4").eval()
    converted = BertForPreTraining.from_pretrained(tmp_path / "out").eval()
    bertkit_model = load_model(tmp_path / "out")
    assert bertkit_model.head == "pretraining"
    want = outputs(reference)
    for model in (converted, bertkit_model):
        for got, ref in zip(outputs(model), want):
            torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
    tok = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    assert tok["do_lower_case"] is True
    assert (tmp_path / "out" / "vocab.txt").read_text() == (RELEASE / "vocab.txt").read_text()


def test_written_checkpoint_converts_as_transformers_would(tmp_path, capsys):
    """A checkpoint written from the format's description, 3 layers: bertkit's conversion against
    transformers 4's loading rules run by hand on the same arrays, in transformers 5."""
    from transformers import BertConfig, BertForPreTraining

    arrays = google_release(tmp_path / "release", np.random.default_rng(2))
    rc, out, err = convert([str(tmp_path / "release" / "bert_model.ckpt"), "--out", str(tmp_path / "out"),
                            "--do-lower-case", "false", "--json"], capsys)
    assert rc == 0, err
    report = json.loads(out)
    assert report["weights"] == len(arrays) and report["left_out"] == 6 and report["lowercase"] is False
    reference = BertForPreTraining(BertConfig.from_json_file(tmp_path / "release" / "bert_config.json")).eval()
    load_like_transformers4(reference, arrays)
    converted = BertForPreTraining.from_pretrained(tmp_path / "out").eval()
    for got, ref in zip(outputs(converted, seed=1), outputs(reference, seed=1)):
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
    assert json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())["do_lower_case"] is False


def test_casing_is_inferred_from_the_vocabulary(tmp_path, capsys):
    google_release(tmp_path / "cased", np.random.default_rng(3))
    (tmp_path / "cased" / "vocab.txt").write_text("".join(t.capitalize() + "\n" if i % 2 and not t.startswith("[")
                                                          else t + "\n" for i, t in enumerate(google_fixture.VOCAB)))
    rc, out, err = convert([str(tmp_path / "cased"), "--out", str(tmp_path / "out")], capsys)
    assert rc == 0, err
    assert "vocab  40 tokens, cased (inferred:" in out
    assert json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())["do_lower_case"] is False


def test_mlm_only_and_encoder_only_checkpoints(tmp_path, capsys):
    from bertkit.checkpoint import load_model

    arrays = google_release(tmp_path / "r", np.random.default_rng(4), slots=False)
    for drop, arch in (("cls/seq_relationship/", "BertForMaskedLM"), ("cls/", "BertModel")):
        kept = {n: a for n, a in arrays.items() if not n.startswith(drop)}
        kept["global_step"] = np.array(1, np.int64)
        write_bundle(tmp_path / "r" / "bert_model.ckpt", kept)
        rc, out, err = convert([str(tmp_path / "r"), "--out", str(tmp_path / arch)], capsys)
        assert rc == 0, err
        assert f"model  {arch}:" in out
        assert json.loads((tmp_path / arch / "config.json").read_text())["architectures"] == [arch]
        load_model(tmp_path / arch)


# ---- one line for each broken input -------------------------------------------------------------
def _flip(f: Path, at: int) -> None:
    raw = bytearray(f.read_bytes())
    raw[at] ^= 0x01
    f.write_bytes(bytes(raw))


def _break(folder: Path, how: str) -> str:
    """Damage a release folder; returns a piece of the error message expected."""
    index, data = folder / "bert_model.ckpt.index", folder / "bert_model.ckpt.data-00000-of-00001"
    if how == "truncated index":
        index.write_bytes(index.read_bytes()[: index.stat().st_size // 2])
        return "bert_model.ckpt.index: truncated or corrupt TensorFlow checkpoint index (no table magic number"
    if how == "corrupt index":
        _flip(index, 20)
        return "bert_model.ckpt.index: truncated or corrupt TensorFlow checkpoint index (the data block at byte 0 fails its checksum)"
    if how == "tiny index":
        index.write_bytes(b"\0" * 10)
        return "shorter than the 48-byte footer"
    if how == "missing shard":
        data.unlink()
        return "bert_model.ckpt.data-00000-of-00001: missing data file"
    if how == "truncated data":
        data.write_bytes(data.read_bytes()[:1000])
        return "bert_model.ckpt.data-00000-of-00001: truncated (1000 bytes; tensor"
    if how == "corrupt data":
        _flip(data, 5)
        return "fails its checksum (the data file is corrupt)"
    if how == "config key":
        cfg = json.loads((folder / "bert_config.json").read_text())
        del cfg["num_attention_heads"]
        (folder / "bert_config.json").write_text(json.dumps(cfg))
        return 'bert_config.json: missing "num_attention_heads"'
    if how == "config value":
        cfg = json.loads((folder / "bert_config.json").read_text())
        cfg["hidden_size"] = "768"
        (folder / "bert_config.json").write_text(json.dumps(cfg))
        return "bert_config.json: hidden_size must be an integer"
    if how == "config shape":
        cfg = json.loads((folder / "bert_config.json").read_text())
        cfg["intermediate_size"] = 99
        (folder / "bert_config.json").write_text(json.dumps(cfg))
        return "bert_model.ckpt: bert_config.json says intermediate_size 99 but encoder.layer.0.intermediate.dense.weight has 24 rows"
    if how == "no vocab":
        (folder / "vocab.txt").unlink()
        return "vocab.txt: no such file"
    if how == "no checkpoint":
        index.unlink()
        return "no TensorFlow checkpoint here (no *.index file)"
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["truncated index", "corrupt index", "tiny index", "missing shard", "truncated data",
                                 "corrupt data", "config key", "config value", "config shape", "no vocab",
                                 "no checkpoint"])
def test_broken_inputs_are_one_line_errors(tmp_path, capsys, how):
    folder = tmp_path / "release"
    shutil.copytree(RELEASE, folder)
    expected = _break(folder, how)
    rc, out, err = convert([str(folder), "--out", str(tmp_path / "out")], capsys)
    assert rc == 1 and out == ""
    assert err.startswith("bertkit convert: error: ") and err.count("\n") == 1, err
    assert expected in err, err
    assert not (tmp_path / "out").exists()


def test_unknown_tensor_names_are_named(tmp_path, capsys):
    arrays = google_release(tmp_path / "r", np.random.default_rng(5), slots=False)
    arrays["output_weights"] = np.zeros((3, 8), np.float32)            # run_classifier.py's head
    write_bundle(tmp_path / "r" / "bert_model.ckpt", arrays)
    rc, _, err = convert([str(tmp_path / "r"), "--out", str(tmp_path / "out")], capsys)
    assert rc == 1 and "tensors that are not weights of Google's BERT: output_weights" in err


def test_docs_show_what_the_command_prints(tmp_path, monkeypatch, capsys):
    """docs/tokenize.md's example output is the command's output, line for line."""
    page = (REPO / "docs" / "tokenize.md").read_text(encoding="utf-8")
    m = re.search(r"```bash\n(bertkit convert [^\n]+)\n```\n\n```text\n(.*?)```", page, flags=re.S)
    assert m, "docs/tokenize.md: no `bertkit convert` example followed by its output"
    (tmp_path / "tests").symlink_to(REPO / "tests")
    monkeypatch.chdir(tmp_path)
    rc, out, err = convert(shlex.split(m.group(1))[2:], capsys)
    assert rc == 0, err
    assert out == m.group(2)
