"""Inputs past the training length, and truncation said by every command (the paper note's failure
mode 5: evidence outside the input window silently changes the task).

An ALiBi model has no position table: every command's --max-length may go past its
max_position_embeddings (a log line says it is past the training length), and the result equals a
direct forward of the model on the same ids. A model with learned positions refuses in one line.
Whatever truncates says how many inputs and tokens it cut: the CLI in a log line, the server in
X-Bertkit-Truncated-* headers and a log line."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit import Tokenizer, preset
from bertkit.checkpoint import build, load_model, save_model
from bertkit.cli import main

REPO = Path(__file__).resolve().parents[1]
WORDS = "the cat sat on a mat and then it ran far away from the old house".split()
POSITIONS = 64                                  # both tiny models' max_position_embeddings


def long_text(n: int, mask_at: int | None = None) -> str:
    """n words of one word piece each ([MASK] at word `mask_at`)."""
    words = [WORDS[i % len(WORDS)] for i in range(n)]
    if mask_at is not None:
        words[mask_at] = "[MASK]"
    return " ".join(words)


@pytest.fixture(autouse=True)
def said_again():
    """The past-the-training-length line is said once per process and length: again for each test."""
    from bertkit import checkpoint
    checkpoint._WARNED.clear()


def tiny(root: Path, minilm: Path, positions: str, head: str = "masked_lm") -> Path:
    torch.manual_seed(0)
    tok = Tokenizer.from_dir(minilm)
    cfg = preset("tiny", vocab_size=tok.vocab_size, max_position_embeddings=POSITIONS,
                 position_embedding_type=positions, norm_position="pre" if positions == "alibi" else "post")
    model = build(head, cfg)
    for p in model.parameters():
        if p.dim() > 1:
            p.data.normal_(0, 0.2)
    out = root / f"{positions}-{head}"
    save_model(model, out)
    tok.save(out)
    return out


@pytest.fixture(scope="module")
def alibi(tmp_path_factory, minilm) -> Path:
    return tiny(tmp_path_factory.mktemp("long"), minilm, "alibi")


@pytest.fixture(scope="module")
def learned(tmp_path_factory, minilm) -> Path:
    return tiny(tmp_path_factory.mktemp("long"), minilm, "absolute")


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def direct(folder: Path, text: str, length: int) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """(ids, last hidden states (T, C), MLM logits (T, V)) of the model run directly on `text` cut to `length`."""
    tok = Tokenizer.from_dir(folder)
    ids = tok.encode(text, max_length=length).input_ids
    model = load_model(folder, head="masked_lm").float()
    with torch.no_grad():
        hidden = model.bert(torch.tensor([ids]))[0]
        return ids, hidden, model.mlm(hidden)


def test_predictor_reads_past_positions_as_a_direct_forward(alibi, caplog, one_thread):
    from bertkit.infer import Predictor

    text = long_text(1100)
    p = Predictor.from_dir(alibi, head="encoder", device="cpu", max_length=1024, precision="fp32", small_batches=False)
    assert p.max_length == 1024
    assert "--max-length 1024 is past the training length 64" in caplog.text and "accuracy may drop" in caplog.text
    states = p.embed([text, "the cat"], pooling="none")
    ids, hidden, _ = direct(alibi, text, 1024)
    assert len(ids) == 1024 and states[0].shape == (1024, 128)
    np.testing.assert_allclose(states[0], hidden.numpy(), atol=1e-4, rtol=1e-4)
    assert p.tokenizer.stats.counts() == (2, 1, 1102 - 1024)


def test_embed_cli_past_positions_and_its_truncation(alibi, capsys, caplog, tmp_path, one_thread):
    text = long_text(1100)
    (tmp_path / "in.txt").write_text(f"{text}\nthe cat sat\n", encoding="utf-8")
    code, out, err = run_cli(capsys, "embed", "--model", alibi, "--max-length", 1024, "--precision", "fp32",
                             "--pooling", "mean", tmp_path / "in.txt")
    assert code == 0, err
    got = np.array(json.loads(out.splitlines()[0])["embedding"])
    _, hidden, _ = direct(alibi, text, 1024)
    np.testing.assert_allclose(got, hidden.mean(0).numpy(), atol=1e-4, rtol=1e-4)
    assert "past the training length 64" in caplog.text
    assert "truncated 1 of 2 inputs (78 tokens cut)" in caplog.text           # 1100 + 2 - 1024


def test_predict_and_fill_mask_past_positions(alibi, capsys, caplog, tmp_path, one_thread):
    """A [MASK] at token 901 of 1,024: predict (a masked-LM checkpoint) and fill-mask answer it as the
    model's own softmax over the logits there."""
    text = long_text(1000, mask_at=900)
    ids, _, logits = direct(alibi, text, 1024)
    at = ids.index(Tokenizer.from_dir(alibi).mask_id)
    probs = torch.softmax(logits[at], -1)
    (tmp_path / "in.jsonl").write_text(json.dumps({"text": text}) + "\n", encoding="utf-8")
    code, out, err = run_cli(capsys, "predict", "--model", alibi, "--max-length", 1024, "--precision", "fp32",
                             tmp_path / "in.jsonl")
    assert code == 0, err
    top = json.loads(out)["candidates"][0][0]
    assert top["id"] == int(probs.argmax()) and top["score"] == pytest.approx(float(probs.max()), abs=1e-4)
    code, out, err = run_cli(capsys, "fill-mask", "--model", alibi, "--max-length", 1024, "--precision", "fp32",
                             "--json", text)
    assert code == 0, err
    top = json.loads(out)[0][0][0]
    assert top["id"] == int(probs.argmax()) and top["score"] == pytest.approx(float(probs.max()), abs=1e-4)
    assert "past the training length 64" in caplog.text


def test_learned_positions_refuse_in_one_line(learned, capsys, tmp_path):
    text = long_text(200, mask_at=5)
    (tmp_path / "in.txt").write_text(text + "\n", encoding="utf-8")
    (tmp_path / "in.jsonl").write_text(json.dumps({"text": text}) + "\n", encoding="utf-8")
    for argv in (("embed", "--model", learned, "--max-length", 1024, tmp_path / "in.txt"),
                 ("fill-mask", "--model", learned, "--max-length", 1024, text),
                 ("predict", "--model", learned, "--max-length", 1024, tmp_path / "in.jsonl")):
        code, out, err = run_cli(capsys, *argv)
        assert code == 1 and out == "", argv
        assert err.count("\n") == 1 and "the model has 64 positions" in err and "Traceback" not in err, (argv, err)
    with pytest.raises(ValueError, match="longer than max_position_embeddings"):
        load_model(learned, head="encoder")(torch.ones(1, 65, dtype=torch.long))


def test_fill_mask_says_what_it_cut(learned, capsys, caplog):
    code, _, err = run_cli(capsys, "fill-mask", "--model", learned, "--max-length", 16, long_text(40, mask_at=3))
    assert code == 0, err
    assert "truncated 1 of 1 inputs (26 tokens cut)" in caplog.text               # 40 + 2 - 16


def test_embed_eval_says_what_it_cut(learned, capsys, caplog, tmp_path):
    rows = ["sentence1\tsentence2\tscore"] + [f"{long_text(n)}\tthe cat\t{n % 5}" for n in (3, 30, 4, 50)]
    (tmp_path / "sts.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    code, _, err = run_cli(capsys, "embed-eval", "--model", learned, "--sts", tmp_path / "sts.tsv",
                           "--max-length", 16, "--pooling", "mean,cls")
    assert code == 0, err
    # per pooling the same 5 distinct texts: two cut, by 30 + 2 - 16 and 50 + 2 - 16 tokens
    assert "sts.tsv, at 16 tokens: truncated 2 of 5 inputs (52 tokens cut)" in caplog.text


def test_choice_and_question_featurizers_say_what_they_cut(minilm, caplog):
    from bertkit.tasks.squad import QAExample, featurize_qa
    from bertkit.tasks.swag import ChoiceExample, featurize_choices

    tok = Tokenizer.from_dir(minilm)
    ex = ChoiceExample("0", long_text(40), "he", ["sat", "ran"], 0, "x:1")
    featurize_choices([ex], tok, max_length=16)
    assert "1 examples (2 context-ending sequences) at max_length 16: truncated 2 of 2 inputs" in caplog.text
    featurize_qa([QAExample("q", long_text(70), long_text(100))], tok, max_length=128, stride=32)
    assert "cut 1 of 1 questions to their first 64 word pieces (6 pieces cut)" in caplog.text
    assert tok.stats.tokens_cut >= 6


def test_serve_says_what_it_cut_and_reads_past_positions(alibi, caplog, one_thread):
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from bertkit.infer import Predictor
    from bertkit.serve import ServeConfig, create_app

    p = Predictor.from_dir(alibi, head="encoder", device="cpu", max_length=1024, precision="fp32", small_batches=False)
    with TestClient(create_app(p, ServeConfig(max_length=p.max_length, warmup=False))) as c:
        text = long_text(1100)
        r = c.post("/v1/embed", json={"texts": [text, "the cat"], "truncate": True, "pooling": "mean"})
        assert r.status_code == 200
        assert (r.headers["x-bertkit-truncated-inputs"], r.headers["x-bertkit-truncated-tokens"]) == ("1", "78")
        _, hidden, _ = direct(alibi, text, 1024)
        np.testing.assert_allclose(r.json()["embeddings"][0], hidden.mean(0).numpy(), atol=1e-4, rtol=1e-4)
        assert "/v1/embed: truncated 1 of 2 inputs to 1024 tokens (78 tokens cut)" in caplog.text
        r = c.post("/v1/embeddings", json={"input": ["the cat", text], "model": "m", "truncate": True})
        assert r.status_code == 200 and r.headers["x-bertkit-truncated-tokens"] == "78"
        assert r.json()["usage"]["prompt_tokens"] == 1024 + 4
        r = c.post("/embed", json={"inputs": "the cat"})
        assert r.status_code == 200 and r.headers["x-bertkit-truncated-inputs"] == "0"
        r = c.post("/v1/embed", json={"texts": [text]})
        assert r.status_code == 413 and "1102 tokens; the limit is 1024" in r.json()["detail"]


@pytest.mark.slow          # (the export itself: ~40 s on 2 busy cores)
def test_onnx_export_of_an_alibi_model_reads_past_positions(tmp_path_factory, minilm, one_thread):
    ort = pytest.importorskip("onnxruntime")
    from bertkit.infer.export import INPUTS, export_onnx

    folder = tiny(tmp_path_factory.mktemp("onnx"), minilm, "alibi", head="encoder")
    export_onnx(folder, folder / "model.onnx")
    ids = Tokenizer.from_dir(folder).encode(long_text(1100), max_length=1024).input_ids
    feed = {"input_ids": np.array([ids]), "token_type_ids": np.zeros((1, 1024), np.int64),
            "attention_mask": np.ones((1, 1024), np.int64)}
    got = ort.InferenceSession(str(folder / "model.onnx"))
    hidden = got.run(None, {n: feed[n] for n in INPUTS})[0][0]
    with torch.no_grad():
        want = load_model(folder, head="encoder")(torch.tensor([ids]))[0]
    np.testing.assert_allclose(hidden, want.numpy(), atol=1e-3, rtol=1e-3)


def test_mlm_vs_length_scores_the_same_predictions_at_every_length(alibi, learned, one_thread):
    spec = importlib.util.spec_from_file_location("mlm_vs_length", REPO / "benchmarks" / "mlm_vs_length.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    docs = ["\n".join([long_text(9)] * n) for n in (30, 5, 14)]          # 270, 45 and 126 pieces
    result = bench.measure(str(alibi), docs, lengths=(16, 32, 128))
    assert (result["documents"], result["documents_too_short"], result["pieces"]) == (2, 1, 252 + 126)
    rows = result["rows"]
    assert len({r["predictions"] for r in rows}) == 1 and rows[0]["predictions"] > 40
    assert [r["windows"] for r in rows] == [27, 14, 3]       # 252/14 + 126/14; 252/30 -> 9 + 126/30 -> 5; 2 + 1
    assert all(0 <= r["accuracy"] <= 1 and r["loss"] > 0 for r in rows)
    from bertkit.errors import BertkitError
    with pytest.raises(BertkitError, match="the model has 64 positions"):
        bench.measure(str(learned), docs, lengths=(16, 128))


def test_the_documented_table_is_the_recorded_run():
    """docs/pretrain-measurements.md's accuracy-against-length table is the two recorded results, row for row."""
    results = REPO / "benchmarks" / "results" / "mlm-vs-length-2026-12-03"
    runs = [json.loads((results / f"quickstart-{n}-updates.json").read_text()) for n in (65, 300)]
    page = (REPO / "docs" / "pretrain-measurements.md").read_text(encoding="utf-8").splitlines()
    for i, first in enumerate(runs[0]["rows"]):
        line = next(ln for ln in page if ln.startswith(f"| {first['length']:,}"))
        cells = [f"{r['accuracy']:.3f} / {r['mask_accuracy']:.3f} / {r['loss']:.3f}"
                 for r in (run["rows"][i] for run in runs)]
        assert line.endswith(f"| {first['windows']} | {cells[0]} | {cells[1]} |"), line


def test_predict_with_a_task_head_past_positions(tmp_path_factory, minilm, capsys, caplog, tmp_path, one_thread):
    """A sentence classifier with ALiBi reads 1,024 tokens in `predict`: its class scores are the
    model's own softmax there, and the cut is said."""
    folder = tiny(tmp_path_factory.mktemp("cls"), minilm, "alibi", head="sequence_classification")
    text = long_text(1100)
    (tmp_path / "in.jsonl").write_text(json.dumps({"text": text}) + "\n", encoding="utf-8")
    code, out, err = run_cli(capsys, "predict", "--model", folder, "--max-length", 1024, tmp_path / "in.jsonl")
    assert code == 0, err
    ids = Tokenizer.from_dir(folder).encode(text, max_length=1024).input_ids
    with torch.no_grad():
        logits = load_model(folder, head="sequence_classification")(torch.tensor([ids]))[0][0]     # (logits, loss)
    scores = list(json.loads(out)["scores"].values())
    np.testing.assert_allclose(scores, torch.softmax(logits, -1).numpy(), atol=1e-4)
    assert "past the training length 64" in caplog.text
    assert "truncated 1 of 1 inputs to 1024 tokens (78 tokens cut)" in caplog.text


def test_prepare_says_how_many_pairs_it_cut(tmp_path, caplog):
    """NSP pairs over max_length lose tokens (Google's truncate_seq_pair): prepare says how many pairs
    and tokens, and its meta counts them."""
    import gzip
    from importlib import resources

    from bertkit.data.prepare import PrepareConfig, prepare

    caplog.set_level("INFO", logger="bertkit")
    text = gzip.decompress((resources.files("bertkit") / "sample" / "inaugural.txt.gz").read_bytes()).decode("utf-8")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(text.split("\n\n")[:6]), encoding="utf-8")
    tok = Tokenizer.train([corpus], vocab_size=2000)
    meta = prepare([str(corpus)], tok, tmp_path / "prep", PrepareConfig(max_length=48), progress=False)
    c = meta["counts"]
    assert 0 < c["pairs_truncated"] <= c["instances"] and c["tokens_truncated"] >= c["pairs_truncated"]
    assert (f"truncated {c['pairs_truncated']} of {c['instances']} sentence pairs to 48 tokens "
            f"({c['tokens_truncated']} tokens cut") in caplog.text


def test_embedding_training_says_what_it_cut(tmp_path_factory, minilm, tmp_path, capsys, caplog, one_thread):
    folder = tiny(tmp_path_factory.mktemp("bi"), minilm, "alibi", head="encoder")
    pairs = [("the cat", long_text(30)), ("a mat", "the old house"), ("far away", long_text(20)), ("it ran", "then")]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in pairs))
    code, _, err = run_cli(capsys, "finetune", "--task", "embedding", "--model", folder,
                           "--data", tmp_path / "train.jsonl", "--out", tmp_path / "out", "--batch_size", "4",
                           "--epochs", "1", "--max_length", "16",
                           "--precision", "fp32", "--no-progress")
    assert code == 0, err
    # 8 distinct texts, two of them cut: 30 + 2 - 16 and 20 + 2 - 16 tokens
    assert "distinct texts at 16 tokens: truncated 2 of 8 inputs (22 tokens cut)" in caplog.text


def test_finetune_and_evaluate_past_positions(alibi, learned, tmp_path, capsys, caplog, one_thread):
    """Fine-tuning and evaluation at 128 tokens on models of 64 positions: ALiBi runs (said once
    each), learned positions stop in one line before anything is written."""
    rows = [(long_text(90 + 7 * i), i % 2) for i in range(8)]
    for split, part in (("train", rows), ("dev", rows[:4])):
        (tmp_path / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{l}\n" for s, l in part))
    args = ["--task", "sst2", "--data", tmp_path, "--max-length", 128, "--batch-size", 4, "--epochs", 1,
            "--threads", 1, "--no-progress"]
    code, _, err = run_cli(capsys, "finetune", "--model", alibi, "--out", tmp_path / "cls", *args)
    assert code == 0, err
    assert "max_length 128 is past the training length 64" in caplog.text
    code, out, err = run_cli(capsys, "evaluate", "--model", tmp_path / "cls", "--data", tmp_path, "--json")
    assert code == 0 and json.loads(out)["examples"] == 4, err
    code, out, err = run_cli(capsys, "finetune", "--model", learned, "--out", tmp_path / "no", *args)
    assert code == 1 and err.count("\n") == 1 and "the model has 64 positions" in err, err
    assert not (tmp_path / "no").exists()
