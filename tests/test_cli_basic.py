"""`bertkit info / tokenize / embed / fill-mask` against transformers and sentence-transformers."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from bertkit.cli import main

from conftest import hf_tiny_config

transformers = pytest.importorskip("transformers")
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Crème brûlée, naïve café!", "北京欢迎你",
         "A much longer sentence, so that the batch has real padding in it when it is run padded."]


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def texts_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("in") / "texts.txt"
    p.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return p


def test_embed_equals_sentence_transformers(capsys, minilm, texts_file, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ref = st.SentenceTransformer(str(minilm), device="cpu").encode(TEXTS, normalize_embeddings=True)
    code, out, _ = run_cli(capsys, "embed", "--model", minilm, "--normalize", texts_file)
    assert code == 0
    got = np.array([json.loads(line)["embedding"] for line in out.splitlines()])
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() < 1e-5
    # .npy output and small batches give the same vectors
    code, _, _ = run_cli(capsys, "embed", "--model", minilm, "--normalize", "--batch-size", "1",
                         "--output", tmp_path / "e.npy", texts_file)
    assert code == 0 and np.abs(np.load(tmp_path / "e.npy") - ref).max() < 1e-5


def test_embed_writes_block_by_block_and_never_a_partial_file(capsys, minilm, texts_file, tmp_path, monkeypatch):
    from bertkit.commands import basic
    from bertkit.infer import Predictor

    code, out, _ = run_cli(capsys, "embed", "--model", minilm, texts_file)
    whole = np.array([json.loads(line)["embedding"] for line in out.splitlines()])
    monkeypatch.setattr(basic, "EMBED_BLOCK", 3)                     # 4 texts: blocks of 3 and 1
    for name in ("e.npy", "e.jsonl"):
        assert run_cli(capsys, "embed", "--model", minilm, "--output", tmp_path / name, texts_file)[0] == 0
        got = np.load(tmp_path / name) if name.endswith(".npy") else np.array(
            [json.loads(line)["embedding"] for line in (tmp_path / name).read_text().splitlines()])
        assert got.shape == whole.shape and np.abs(got - whole).max() < 1e-6
    calls = []

    def fail_second_block(self, texts, *a, **k):
        calls.append(len(texts))
        if len(calls) == 2:
            raise RuntimeError("out of memory")
        return real_embed(self, texts, *a, **k)

    real_embed = Predictor.embed
    monkeypatch.setattr(Predictor, "embed", fail_second_block)
    with pytest.raises(RuntimeError):
        main(["embed", "--model", str(minilm), "--output", str(tmp_path / "f.npy"), str(texts_file)])
    assert calls == [3, 1] and not any(p.name.startswith("f.npy") for p in tmp_path.iterdir())


def test_embed_cls_and_token_pooling_equal_transformers(capsys, minilm, texts_file):
    code, out, _ = run_cli(capsys, "embed", "--model", minilm, "--pooling", "cls", texts_file)
    cls_vecs = np.array([json.loads(line)["embedding"] for line in out.splitlines()])
    code, out, _ = run_cli(capsys, "embed", "--model", minilm, "--pooling", "none", texts_file)
    tokens = [np.array(json.loads(line)["embedding"]) for line in out.splitlines()]
    tok = transformers.BertTokenizer.from_pretrained(minilm)
    hf = transformers.BertModel.from_pretrained(minilm).eval()
    for i, t in enumerate(TEXTS):
        with torch.no_grad():
            h = hf(**tok(t, return_tensors="pt")).last_hidden_state[0].numpy()
        assert np.abs(tokens[i] - h).max() < 1e-5
        assert np.abs(cls_vecs[i] - h[0]).max() < 1e-5


def test_tokenize_jsonl_pairs_equal_transformers(capsys, minilm, tmp_path):
    src = tmp_path / "pairs.jsonl"
    rows = [{"text": "What is BERT?", "text_pair": "A bidirectional encoder."}, {"text": "Solo text, no pair."}]
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    code, out, _ = run_cli(capsys, "tokenize", "--model", minilm, src)
    assert code == 0
    got = [json.loads(line) for line in out.splitlines()]
    tok = transformers.BertTokenizer.from_pretrained(minilm)
    for g, r in zip(got, rows):
        ref = tok(r["text"], r.get("text_pair"), return_offsets_mapping=True)
        assert g["input_ids"] == ref["input_ids"]
        assert g["token_type_ids"] == ref["token_type_ids"]
        assert g["offsets"] == [list(o) for o in ref["offset_mapping"]]
        assert g["tokens"] == tok.convert_ids_to_tokens(ref["input_ids"])


def test_tokenize_truncation_is_reported(capsys, minilm, texts_file):
    code, out, err = run_cli(capsys, "tokenize", "--model", minilm, "--max-length", "6", texts_file)
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert all(len(r["input_ids"]) <= 6 for r in rows)
    assert sum(r["truncated"] > 0 for r in rows) >= 3


@pytest.mark.parametrize("arch", ["BertForMaskedLM", "BertForPreTraining"])
def test_fill_mask_equals_transformers(capsys, minilm, tmp_path, arch):
    torch.manual_seed(3)
    cfg = hf_tiny_config(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=40, hidden_act="relu", max_position_embeddings=128)
    hf = getattr(transformers, arch)(cfg).eval()
    hf.save_pretrained(tmp_path)
    for f in ("vocab.txt", "tokenizer_config.json"):
        (tmp_path / f).write_bytes((minilm / f).read_bytes())
    texts = ["Paris is the [MASK] of France.", "The [MASK] sat on the [MASK] mat."]
    code, out, _ = run_cli(capsys, "fill-mask", "--model", tmp_path, "--top-k", "3", "--json", *texts)
    assert code == 0
    got = json.loads(out)
    tok = transformers.BertTokenizer.from_pretrained(tmp_path)
    for text, masks in zip(texts, got):
        enc = tok(text, return_tensors="pt")
        with torch.no_grad():
            logits = hf(**enc).logits if arch == "BertForMaskedLM" else hf(**enc).prediction_logits
        where = (enc["input_ids"][0] == tok.mask_token_id).nonzero().flatten()
        assert len(masks) == len(where)
        for m, pos in zip(masks, where):
            probs = logits[0, pos].softmax(-1)
            top = probs.topk(3)
            assert [c["id"] for c in m] == top.indices.tolist()
            assert np.allclose([c["score"] for c in m], top.values.numpy(), atol=1e-5)
            assert [c["token"] for c in m] == tok.convert_ids_to_tokens(top.indices.tolist())
    code, out, _ = run_cli(capsys, "fill-mask", "--model", tmp_path, texts[0])
    assert code == 0 and "[MASK] 1:" in out


def test_info(capsys, minilm):
    code, out, _ = run_cli(capsys, "info", "--json", minilm)
    info = json.loads(out)
    assert code == 0
    assert info["config"]["num_hidden_layers"] == 6 and info["parameters"] == 22_713_216
    assert info["heads"] == [] and info["pooler"] is True
    assert info["tokenizer"]["lowercase"] is True
    code, out, _ = run_cli(capsys, "info", minilm)
    assert "6 layers, hidden 384, 12 heads" in out and "uncased" in out


def test_bad_input_is_one_line_and_nonzero(capsys, minilm, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine line\nbroken \xff line\n")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    badjson = tmp_path / "bad.jsonl"
    badjson.write_text('{"text": "ok"}\n{"txt": "no text field"}\n')
    cases = [
        (["embed", "--model", minilm, bad], "bad.txt:2: invalid UTF-8"),
        (["tokenize", "--model", minilm, empty], "no input texts"),
        (["tokenize", "--model", minilm, tmp_path / "missing.txt"], "missing.txt: no such file"),
        (["tokenize", "--model", minilm, badjson], "bad.jsonl:2: expected an object"),
        (["embed", "--model", tmp_path, empty], "no config.json"),
        (["info", tmp_path / "nope"], "no such directory"),
        (["fill-mask", "--model", minilm, "no mask here"], "no weights for the masked_lm head"),
        (["tokenize", "--model", tmp_path, bad], "no vocab.txt or tokenizer.json"),
    ]
    for argv, message in cases:
        code, _, err = run_cli(capsys, *argv)
        assert code == 1, argv
        lines = [line for line in err.splitlines() if "error:" in line]
        assert len(lines) == 1 and message in lines[0], (argv, err)
        assert "Traceback" not in err


def test_module_entry_point_and_help(minilm, tmp_path):
    r = subprocess.run([sys.executable, "-m", "bertkit", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "fill-mask" in r.stdout
    r = subprocess.run([sys.executable, "-m", "bertkit", "embed", "--model", str(tmp_path), "x.txt"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "error:" in r.stderr


def test_cli_keeps_freed_memory_for_the_next_allocation(monkeypatch):
    """The `bertkit` command asks glibc to keep freed blocks (heap.Heap.keep_freed): a 64 MB buffer
    allocated again and again comes back without faulting its 16,384 pages in each time (glibc alone
    maps anything over 32 MB afresh each time). BERTKIT_SYSTEM_MALLOC=1 leaves malloc alone."""
    import platform
    import resource

    import torch

    from bertkit.heap import Heap

    monkeypatch.setenv("BERTKIT_SYSTEM_MALLOC", "1")
    assert Heap().keep_freed().startswith("system malloc settings kept")
    monkeypatch.delenv("BERTKIT_SYSTEM_MALLOC")
    said = Heap().keep_freed()
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        assert said.startswith("system malloc settings kept")
        return
    assert said.startswith("glibc malloc keeps freed blocks")
    faults = []
    for _ in range(8):     # the first few may extend the heap (a freed block is reused once one fits)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        torch.empty(16 << 20, dtype=torch.float32).fill_(1.0)      # 64 MB, freed at once
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    assert max(faults[-3:]) < 1000, faults
