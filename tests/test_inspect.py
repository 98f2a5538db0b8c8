"""`bertkit inspect`: attention recomputed from the weights reproduces every layer, the segment-change
test (causal: the left tokens do not move; bidirectional: they do), MLM predictions and the
degenerate left-to-right generation, the report end to end and its one-line errors. Tiny models of
a small word vocabulary; all-MiniLM-L6-v2 for the check on real weights."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bertkit import Tokenizer, preset
from bertkit.checkpoint import build, save_model
from bertkit.cli import main
from bertkit.inspect import Loaded, explicit_attention, inspect, load, segment_test, trace

WORDS = ("the a cat dog sat ran on in mat sun it was warm cold and . , is of capital france paris "
         "big small house tree bird sang").split()


def tiny_lm(root: Path, name: str = "lm", **config) -> Path:
    """A 2-layer MLM checkpoint (random weights) with a word-level vocabulary."""
    torch.manual_seed(0)
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    tok = Tokenizer(vocab)
    cfg = preset("tiny", vocab_size=len(vocab), max_position_embeddings=32, hidden_size=32, num_heads=4,
                 intermediate_size=64, **config)
    model = build("masked_lm", cfg)
    for p in model.parameters():
        if p.dim() > 1:
            p.data.normal_(0, 0.3)
    out = root / name
    save_model(model, out)
    tok.save(out)
    return out


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> Path:
    return tiny_lm(tmp_path_factory.mktemp("inspect"))


@pytest.fixture(scope="module")
def causal_lm(tmp_path_factory) -> Path:
    return tiny_lm(tmp_path_factory.mktemp("inspect"), "clm", causal=True)


@pytest.mark.parametrize("config", [{}, {"causal": True}, {"position_embedding_type": "alibi"},
                                    {"norm_position": "pre"}], ids=["bert", "causal", "alibi", "pre-ln"])
def test_attention_rows_sum_to_one_and_reproduce_every_layer(tmp_path, config, one_thread):
    loaded = load(tiny_lm(tmp_path, **config))
    enc = loaded.tokenizer.encode("the cat sat on the mat .", "it was warm .")
    t = trace(loaded.encoder, enc.input_ids, enc.token_type_ids)
    L, H, T = loaded.model.config.num_layers, loaded.model.config.num_heads, len(enc)
    assert t.probs.shape == (L, H, T, T) and t.states.shape[:2] == (L + 1, T)
    assert t.row_error < 1e-6 and t.max_diff < 1e-5
    assert torch.allclose(t.probs.sum(-1), torch.ones(L, H, T), atol=1e-6)
    above = torch.ones(T, T, dtype=torch.bool).triu(1)
    if config.get("causal"):
        assert float(t.probs[..., above].abs().max()) == 0.0
    else:
        assert float(t.probs[..., above].min()) > 0
    # layer by layer, on the layer's own input: the written-out attention gives the module's output
    for block, x in zip(loaded.encoder.blocks, t.states[:-1]):
        y, p = explicit_attention(block.attn, x[None], None)
        assert torch.allclose(y, block.attn(x[None], None), atol=1e-5)


def test_segment_change_causal_zero_bidirectional_positive(lm, causal_lm, one_thread):
    r = segment_test(load(lm), "the cat sat on the mat .", "it was warm in the sun .", other="a dog ran .")
    assert set(r["change"]) == {"bidirectional", "causal"}
    assert set(r["change"]["causal"]) == {"masks", "shuffled", "other sentence"}
    assert r["left_tokens"][0] == "[CLS]" and r["left_tokens"][-1] == "[SEP]"
    bi, causal = r["summary"]["bidirectional"], r["summary"]["causal"]
    assert causal["max"] < 1e-6                       # left of the change, nothing moves
    assert bi["last_layer_mean"] > 1e-2 and bi["last_layer_cls"] > 1e-2
    assert bi["per_layer_mean"][0] == 0.0             # the embeddings are per token
    # a causal checkpoint: its own mask only, the left tokens unchanged
    rc = segment_test(load(causal_lm), "the cat sat on the mat .", "it was warm in the sun .")
    assert set(rc["change"]) == {"causal"} and rc["summary"]["causal"]["max"] < 1e-6


def test_masks_filled_and_generation_degenerate(lm, causal_lm, one_thread):
    r = inspect(load(lm), "the capital of france is [MASK] .", steps=4)
    (f,) = r["fill_mask"]
    probs = [c["prob"] for c in f["candidates"]]
    assert f["position"] == 6 and len(probs) == 5 and probs == sorted(probs, reverse=True) and sum(probs) <= 1 + 1e-6
    g = r["generate"]
    assert g["prompt"] == "the capital of france is" and len(g["tokens"]) == 4
    assert "append [MASK]" in g["method"] and "never p(x_{t+1}" in r["answers"]["generate"]
    rc = inspect(load(causal_lm), "the cat sat", steps=3)
    assert rc["fill_mask"] == [] and len(rc["generate"]["tokens"]) == 3 and rc["attention"]["position"] == 4
    assert "causal" in rc["answers"]["generate"] and rc["attention"]["mass"]["[CLS]"][0] < 1


def test_minilm_attention_reproduces_real_weights(minilm, one_thread):
    loaded = load(minilm)
    assert isinstance(loaded, Loaded) and loaded.mlm is None
    r = inspect(loaded, "The cat sat on the mat.", "It was warm in the sun.")
    assert r["check"]["max_diff"] < 1e-5 and r["check"]["row_error"] < 1e-5
    mass = r["attention"]["mass"]
    assert all(abs(mass["[CLS]"][i] + mass["[SEP]"][i] + mass["words"][i] - 1) < 1e-5 for i in range(6))
    s = r["segment"]["summary"]
    assert s["causal"]["max"] < 1e-5 and s["bidirectional"]["last_layer_mean"] > 0.05
    assert "generate" not in r and "no language-model head" in r["answers"]["generate"]


def test_cli_writes_the_report(lm, tmp_path, capsys, one_thread):
    pytest.importorskip("matplotlib")
    out = tmp_path / "report"
    assert main(["inspect", "--model", str(lm), "the cat sat on the [MASK] .", "it was warm .", "--out", str(out),
                 "--steps", "3", "--layer", "1", "--replace", "a dog ran ."]) == 0
    printed = capsys.readouterr().out
    assert "segment change" in printed and "[MASK] at 6:" in printed and f"wrote {out / 'report.html'}" in printed
    page = (out / "report.html").read_text(encoding="utf-8")
    assert page.count("data:image/png;base64,") == 4 and "What is [CLS] for?" in page
    assert "Greedy generation (append [MASK], take the argmax, repeat)" in page and "[MASK] at position 6" in page
    for name in ("cls_attention", "cls_attention_heads", "attention_layer1", "segment_change"):
        assert (out / f"{name}.png").stat().st_size > 5000
    r = json.loads((out / "report.json").read_text())
    assert r["run"]["commit"] and r["segment"]["summary"]["causal"]["max"] < 1e-6
    assert main(["inspect", "--model", str(lm), "the cat sat on the mat", "--json", "--steps", "0"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["segment"]["split"] and r["segment"]["text"] == "the cat sat" and r["generate"] is None


@pytest.mark.parametrize("args, message", [
    (["--model", "{tmp}/nope", "the cat"], "--model {tmp}/nope: no such folder"),
    (["--model", "{lm}", ""], "the text is empty"),
    (["--model", "{lm}", "the cat", "  "], "the pair is empty"),
    (["--model", "{lm}", "the cat " * 20], "the input is 42 tokens ([CLS] and [SEP] included); this model reads at "
                                           "most 32 positions"),
    (["--model", "{lm}", "the cat", "--layer", "3"], "--layer 3: this model has layers 1 to 2"),
    (["--model", "{lm}", "cat"], "the segment-change test needs a right-hand segment"),
    (["--model", "{lm}", "the cat", "--top-k", "0"], "top_k must be at least 1, got 0"),
    (["--model", "{lm}", "the cat", "--out", "{file}"], "exists and is not a folder"),
])
def test_cli_errors_are_one_line(lm, tmp_path, capsys, args, message):
    (tmp_path / "file").write_text("x")
    fill = lambda s: s.format(tmp=tmp_path, lm=lm, file=tmp_path / "file")
    assert main(["inspect", *map(fill, args)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bertkit inspect: error: ") and fill(message) in err, err


def test_server_route(lm, one_thread):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertkit.infer import Predictor
    from bertkit.serve import ServeConfig, create_app

    p = Predictor.from_dir(lm, device="cpu", small_batches=False)
    with TestClient(create_app(p, ServeConfig(max_length=16))) as c:
        r = c.post("/v1/inspect", json={"text": "the cat sat on the [MASK] .", "pair": "it was warm .", "steps": 2})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["segment"]["summary"]["causal"]["max"] < 1e-6 and len(body["generate"]["tokens"]) == 2
        assert len(body["attention"]["mean"]) == 2 and len(body["attention"]["mean"][0]) == len(body["tokens"])
        r = c.post("/v1/inspect", json={"text": " "})
        assert r.status_code == 422 and r.json()["detail"] == "the text is empty"
        r = c.post("/v1/inspect", json={"text": "the cat " * 10})
        assert r.status_code == 413 and "--max-length" in r.text
    with TestClient(create_app(p, ServeConfig(max_length=16, api_key="k"))) as c:
        assert c.post("/v1/inspect", json={"text": "the cat"}).status_code == 401
        assert c.post("/v1/inspect", json={"text": "the cat"}, headers={"authorization": "Bearer k"}).status_code == 200
