"""The fine-tuning loop end to end on a tiny model and synthetic data it must learn, plus the
checkpoint it writes (HF-loadable, id2label, evaluate/predict agree with metrics.json)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit import Tokenizer, load_model, preset, save_model
from bertkit.checkpoint import CheckpointError, build
from bertkit.cli import main
from bertkit.finetune import FinetuneConfig, finetune, grid
from bertkit.probe import ProbeModel
from bertkit.tasks import DataError

POS, NEG = ["good", "great", "fine"], ["bad", "awful", "poor"]
FILL = ["the", "movie", "was", "a", "film", "plot", "and", "it", "is", "very"]
CITIES, PEOPLE = ["paris", "london", "rome"], ["john", "mary"]
WORDS = POS + NEG + FILL + CITIES[:2] + PEOPLE + ["new", "york", "in", "lives", "rom", "##e", "."]


pytestmark = pytest.mark.usefixtures("one_thread")    # conftest: tiny models, one thread


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A 2-layer, 32-wide BERT with a 30-word vocabulary, saved as an HF folder with its tokenizer."""
    d = tmp_path_factory.mktemp("tiny_bert")
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    tok = Tokenizer(vocab, lowercase=True)
    torch.manual_seed(0)
    cfg = preset("tiny", vocab_size=len(vocab), hidden_size=32, num_heads=2, intermediate_size=64,
                 max_position_embeddings=64)
    save_model(build("encoder", cfg), d)
    tok.save(d)
    return d


def sentiment_rows(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.random() < 0.5
        words = rng.sample(FILL, 4) + [rng.choice(POS if label else NEG)]
        rng.shuffle(words)
        rows.append((" ".join(words), "1" if label else "0"))
    return rows


@pytest.fixture(scope="module")
def sst_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("sst")
    for split, n, seed in (("train", 320, 1), ("dev", 80, 2)):
        text = "sentence\tlabel\n" + "".join(f"{s} \t{l}\n" for s, l in sentiment_rows(n, seed))
        (d / f"{split}.tsv").write_text(text, encoding="utf-8")
    return d


def ner_sentences(n: int, seed: int) -> list[list[tuple[str, str]]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        who = rng.choice(PEOPLE)
        where = rng.choice([["paris"], ["london"], ["rome"], ["new", "york"]])
        tags = ["B-LOC"] + ["I-LOC"] * (len(where) - 1)
        out.append([(who, "B-PER"), ("lives", "O"), ("in", "O"), *zip(where, tags), (".", "O")])
    return out


@pytest.fixture(scope="module")
def conll_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("conll")
    for split, n, seed in (("train", 240, 1), ("valid", 60, 2)):
        text = "\n".join("\n".join(f"{w} NN O {t}" for w, t in s) + "\n" for s in ner_sentences(n, seed))
        (d / f"{split}.txt").write_text(text, encoding="utf-8")
    return d


def cfg(**kw) -> FinetuneConfig:
    base = dict(batch_size=16, lr=2e-3, epochs=4, warmup=0.1, progress=False, max_length=32, log_every=5)
    base.update(kw)
    return FinetuneConfig(**base)


def test_sequence_classification_learns_and_checkpoint_round_trips(tiny_model, sst_dir, tmp_path, capsys):
    out = tmp_path / "run"
    result = finetune(cfg(task="sst2", data=str(sst_dir), model=str(tiny_model), out=str(out)))
    assert result["dev"]["accuracy"] >= 0.95, result["history"]
    assert result["history"] and result["best_step"] is not None
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "0", "1": "1"} and config["architectures"] == ["BertForSequenceClassification"]
    assert config["bertkit_task"] == {"name": "sst2"}
    for name in ("model.safetensors", "vocab.txt", "tokenizer.json", "metrics.json", "metrics.jsonl",
                 "run_card.md", "run_card.json", "finetune.yaml", "dev_predictions.jsonl"):
        assert (out / name).is_file(), name
    # evaluate re-computes the dev metric of the saved (best) checkpoint exactly
    assert main(["evaluate", "--model", str(out), "--data", str(sst_dir / "dev.tsv"), "--json"]) == 0
    ev = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert ev["accuracy"] == pytest.approx(result["dev"]["accuracy"])
    # transformers loads the same folder and computes the same logits
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertForSequenceClassification.from_pretrained(out).eval()
    ours = load_model(out).eval()
    tok = Tokenizer.from_dir(out)
    batch = tok(["the movie was good", "a bad plot"])
    with torch.no_grad():
        torch.testing.assert_close(ours(**batch)[0], hf(**batch).logits, atol=1e-5, rtol=1e-4)
    assert hf.config.id2label == {0: "0", 1: "1"}


def test_predict_jsonl(tiny_model, sst_dir, tmp_path, capsys):
    out = tmp_path / "run"
    finetune(cfg(task="sst2", data=str(sst_dir), model=str(tiny_model), out=str(out)))
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"text": "the film was great"}\n{"id": "b", "text": "awful movie"}\n', encoding="utf-8")
    capsys.readouterr()
    assert main(["predict", "--model", str(out), str(inp)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in rows] == ["0", "b"]
    assert [r["prediction"] for r in rows] == ["1", "0"]
    assert sum(rows[0]["scores"].values()) == pytest.approx(1.0, abs=1e-5)


def test_token_classification_learns_first_subword(tiny_model, conll_dir, tmp_path, capsys):
    out = tmp_path / "ner"
    result = finetune(cfg(task="conll2003", data=str(conll_dir), model=str(tiny_model), out=str(out), epochs=6))
    assert result["dev"]["f1"] >= 0.95, result["history"]
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"tokens": ["mary", "lives", "in", "rome", "."]}\n', encoding="utf-8")
    capsys.readouterr()
    assert main(["predict", "--model", str(out), str(inp)]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["prediction"] == ["B-PER", "O", "O", "B-LOC", "O"]      # 'rome' is two pieces: rom ##e


def test_regression_stsb(tiny_model, tmp_path):
    rng = random.Random(0)
    d = tmp_path / "stsb"
    d.mkdir()
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    for split, n in (("train", 300), ("dev", 60)):
        lines = []
        for i in range(n):
            k = rng.randint(0, 3)       # score = number of positive words, 0..3
            words = rng.sample(FILL, 4 - k) + rng.sample(POS, k)
            lines.append(f"{i}\tg\tf\ty\t{i}\tn\tn\t{' '.join(words)}\tthe movie\t{k:.3f}\n")
        (d / f"{split}.tsv").write_text(header + "".join(lines), encoding="utf-8")
    result = finetune(cfg(task="stsb", data=str(d), model=str(tiny_model), out=str(tmp_path / "o"), epochs=6))
    assert result["dev"]["pearson"] > 0.8
    assert json.loads((tmp_path / "o" / "config.json").read_text())["problem_type"] == "regression"


def test_frozen_probe_keeps_encoder_and_concatenates_layers(tiny_model, conll_dir, tmp_path):
    out = tmp_path / "probe"
    result = finetune(cfg(task="conll2003", data=str(conll_dir), model=str(tiny_model), out=str(out), freeze=True,
                          probe_features="concat_last_2", lr=1e-2, epochs=4))
    assert result["dev"]["f1"] > 0.9, result["history"]           # word identity is in the frozen features
    model, raw = load_model(out).eval(), json.loads((out / "config.json").read_text())
    assert isinstance(model, ProbeModel) and raw["bertkit_probe"] == {"features": "concat_last_2",
                                                                      "combine": "concat", "layers": [1, 2]}
    assert model.classifier.weight.shape == (4, 64)                 # B-LOC, B-PER, I-LOC, O from 2 x 32
    from safetensors.torch import load_file
    before = load_file(str(tiny_model / "model.safetensors"))
    after = load_file(str(out / "model.safetensors"))
    name = "encoder.layer.0.attention.self.query.weight"
    assert torch.equal(before[name], after["bert." + name])                # the encoder did not move
    raw["bertkit_probe_layers"] = 2                                         # an older bertkit's spelling: refused
    del raw["bertkit_probe"]
    (out / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="bertkit_probe_layers K is now bertkit_probe"):
        load_model(out)


def test_random_init_and_grid(tiny_model, sst_dir, tmp_path):
    out = tmp_path / "grid"
    summary = grid(cfg(task="sst2", data=str(sst_dir), model=str(tiny_model), out=str(out), init="random"),
                   space={"lr": (2e-3, 1e-5), "epochs": (1,)})
    assert len(summary["runs"]) == 2 and summary["best"]["lr"] == 2e-3     # 1e-5 for 1 epoch learns nothing
    assert (out / "model.safetensors").is_file() and (out / "grid.json").is_file()


def test_unseen_label_at_evaluation_is_an_error(tiny_model, sst_dir, tmp_path, capsys):
    out = tmp_path / "run"
    finetune(cfg(task="sst2", data=str(sst_dir), model=str(tiny_model), out=str(out), epochs=1))
    bad = tmp_path / "dev.tsv"
    bad.write_text("sentence\tlabel\nthe movie was good \t1\nthe plot \t2\n", encoding="utf-8")
    assert main(["evaluate", "--model", str(out), "--data", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "dev.tsv:3" in err and "'2'" in err


def test_custom_csv_classification_with_columns(tiny_model, tmp_path):
    rows = sentiment_rows(400, 3)
    import csv
    for split, part in (("train", rows[:320]), ("dev", rows[320:])):
        with open(tmp_path / f"{split}.csv", "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["review", "stars"])
            w.writerows([(s, "pos" if l == "1" else "neg") for s, l in part])
    result = finetune(cfg(task="classify", train_file=str(tmp_path / "train.csv"),
                          dev_file=str(tmp_path / "dev.csv"), text_column="review", label_column="stars",
                          model=str(tiny_model), out=str(tmp_path / "o"), epochs=5))
    assert result["dev"]["accuracy"] >= 0.9
    config = json.loads((tmp_path / "o" / "config.json").read_text())
    assert config["id2label"] == {"0": "neg", "1": "pos"}
    assert config["bertkit_task"]["columns"]["text_column"] == "review"


def test_cli_errors_are_one_line(tiny_model, tmp_path, capsys):
    empty = tmp_path / "train.tsv"
    empty.write_text("", encoding="utf-8")
    assert main(["finetune", "--task", "sst2", "--train-file", str(empty), "--model", str(tiny_model),
                 "--out", str(tmp_path / "o"), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train.tsv" in err
    assert main(["finetune", "--task", "sst3", "--data", str(tmp_path), "--model", str(tiny_model)]) == 1
    assert "did you mean" in capsys.readouterr().err
    with pytest.raises(DataError):
        from bertkit.tasks import get_task
        get_task("sst2").read(empty)


@pytest.mark.parametrize("head, line, check", [
    ("question_answering", '{"question": "who lives in paris", "context": "john lives in paris ."}',
     lambda r: isinstance(r["prediction"], str) and r["prediction"] in "john lives in paris ."),
    ("multiple_choice", '{"context": "john lives in", "endings": ["paris", "the movie", "rome"]}',
     lambda r: r["prediction"] in (0, 1, 2)),
    ("masked_lm", '{"text": "john lives in [MASK] ."}',
     lambda r: len(r["prediction"]) == 1 and len(r["candidates"][0]) == 3),
])
def test_predict_every_head(tiny_model, tmp_path, capsys, head, line, check):
    model = load_model(tiny_model, head=head, new_head_ok=True)
    save_model(model, tmp_path / "m")
    Tokenizer.from_dir(tiny_model).save(tmp_path / "m")
    (tmp_path / "in.jsonl").write_text(line + "\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["predict", "--model", str(tmp_path / "m"), str(tmp_path / "in.jsonl"), "--top-k", "3"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["id"] == "0" and check(row), row


def squad_json(n: int, seed: int) -> dict:
    """SQuAD v1.1 JSON: 'X lives in C .' at a random place among filler words; the answer is C."""
    rng = random.Random(seed)
    paragraphs = []
    for i in range(n):
        who, city = rng.choice(PEOPLE), rng.choice(CITIES[:2] + ["new york"])
        before, after = " ".join(rng.sample(FILL, rng.randint(0, 8))), " ".join(rng.sample(FILL, rng.randint(0, 8)))
        context = f"{before} {who} lives in {city} . {after}".strip()
        start = context.index(f"{who} lives in {city}") + len(f"{who} lives in ")
        paragraphs.append({"context": context, "qas": [{"id": f"q{i}", "question": f"{who} lives in",
                                                        "answers": [{"text": city, "answer_start": start}]}]})
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}


@pytest.mark.parametrize("packed", [True, False])
def test_squad_learns_packed_or_padded(tiny_model, tmp_path, packed):
    d = tmp_path / "squad"
    d.mkdir()
    for split, n, seed in (("train", 400, 1), ("dev", 80, 2)):
        (d / f"{split}.json").write_text(json.dumps(squad_json(n, seed)), encoding="utf-8")
    out = tmp_path / "run"
    result = finetune(cfg(task="squad", data=str(d), model=str(tiny_model), out=str(out), max_length=40,
                          stride=16, epochs=6, packed=packed))
    assert result["dev"]["f1"] >= 90, result["history"]
    lines = [json.loads(x) for x in (out / "dev_predictions.jsonl").read_text().splitlines()]
    assert len(lines) == 80


@pytest.mark.parametrize("windows", [None, True])
def test_long_inputs_truncated_or_windowed_and_recorded(tiny_model, sst_dir, tmp_path, capsys, windows):
    """Inputs of 7 tokens at max_length 6: truncated by default, windows on request; the choice and
    its counts are in metrics.json, the run card and config.json, and `evaluate` reads inputs the
    same way (so it reproduces the dev metric)."""
    out = tmp_path / "run"
    result = finetune(cfg(task="sst2", data=str(sst_dir), model=str(tiny_model), out=str(out), epochs=1,
                          max_length=6, windows=windows))
    inputs = result["inputs"]
    assert inputs["windows"] is bool(windows)
    train = inputs["train"]
    if windows:
        assert train["windowed_examples"] == 320 and train["max_windows"] == 2 and train["features"] == 640
        assert inputs["stride"] == 1 and train["truncated_examples"] == 0
    else:
        assert train["features"] == 320 and train["truncated_examples"] == 320 and inputs["stride"] is None
    card = json.loads((out / "run_card.json").read_text())
    assert card["inputs"] == inputs
    assert json.loads((out / "config.json").read_text())["bertkit_stride"] == inputs["stride"]
    capsys.readouterr()
    assert main(["evaluate", "--model", str(out), "--data", str(sst_dir / "dev.tsv"), "--json"]) == 0
    ev = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert ev["accuracy"] == pytest.approx(result["dev"]["accuracy"])


def squad2_json(n: int, seed: int) -> dict:
    """SQuAD v2.0 JSON: as squad_json, but a third of the questions ask about someone the
    context does not mention (no answer)."""
    doc = squad_json(n, seed)
    rng = random.Random(seed + 100)
    for para in doc["data"][0]["paragraphs"]:
        qa = para["qas"][0]
        if rng.random() < 1 / 3:
            who = qa["question"].split()[0]
            qa["question"] = qa["question"].replace(who, "mary" if who == "john" else "john", 1)
            qa["answers"], qa["is_impossible"] = [], True
    doc["version"] = "v2.0"
    return doc


def test_squad2_null_threshold_and_doc_stride_travel_with_the_model(tiny_model, tmp_path, capsys, monkeypatch):
    from bertkit.infer import Predictor
    from bertkit.tasks import get_task

    d = tmp_path / "squad2"
    d.mkdir()
    for split, n, seed in (("train-v2.0", 400, 1), ("dev-v2.0", 80, 2)):
        (d / f"{split}.json").write_text(json.dumps(squad2_json(n, seed)), encoding="utf-8")
    out = tmp_path / "run"
    result = finetune(cfg(task="squad2", data=str(d), model=str(tiny_model), out=str(out), max_length=40,
                          stride=16, epochs=6))
    dev = result["dev"]
    assert dev["best_f1"] >= 60, result["history"]            # all-null: 1/3 of questions
    raw = json.loads((out / "config.json").read_text())
    assert raw["bertkit_null_threshold"] == dev["best_f1_thresh"] and raw["bertkit_stride"] == 16
    # evaluate applies the saved threshold: its F1 is the best F1 found on dev
    capsys.readouterr()
    assert main(["evaluate", "--model", str(out), "--data", str(d), "--json"]) == 0
    ev = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert ev["f1"] == pytest.approx(dev["best_f1"])
    assert main(["evaluate", "--model", str(out), "--data", str(d), "--json", "--null-threshold", "1e6"]) == 0
    never_null = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert never_null["NoAns_f1"] == 0.0                   # every question answered
    # predict: the saved threshold and doc stride; the Predictor (serve) answers the same
    strides = []
    task = get_task("squad2")
    featurize = task.featurize
    monkeypatch.setattr(task, "featurize", lambda *a, **kw: strides.append(kw["stride"]) or featurize(*a, **kw))
    paras = squad2_json(30, 3)["data"][0]["paragraphs"]
    rows = [{"id": p["qas"][0]["id"], "question": p["qas"][0]["question"], "context": p["context"]} for p in paras]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert main(["predict", "--model", str(out), str(inp)]) == 0
    got = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert strides == [16]
    threshold = raw["bertkit_null_threshold"]
    assert all((r["prediction"] == "") == (r["null_odds"] > threshold) for r in got)
    median = float(np.median([r["null_odds"] for r in got]))
    assert main(["predict", "--model", str(out), str(inp), "--null-threshold", str(median)]) == 0
    cut = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert all((r["prediction"] == "") == (r["null_odds"] > median) for r in cut)
    assert 0 < sum(r["prediction"] == "" for r in cut) < len(cut)
    predictor = Predictor.from_dir(out, precision="fp32")
    predictor.null_threshold = median                      # what `serve --null-threshold` sets
    assert [a["answer"] for a in predictor.qa([r["question"] for r in rows], [r["context"] for r in rows])] == \
        [r["prediction"] for r in cut]
    answers = Predictor.from_dir(out, precision="fp32").qa([r["question"] for r in rows], [r["context"] for r in rows])
    assert [a["answer"] for a in answers] == [r["prediction"] for r in got]
    assert main(["predict", "--model", str(out), str(inp), "--null-threshold", "nan"]) == 1
    assert "finite" in capsys.readouterr().err


@pytest.mark.parametrize("freeze", [False, True])
def test_run_card_answers_the_reproduction_checklist(tiny_model, sst_dir, tmp_path, freeze):
    """Probe or full fine-tuning (and the features), attention direction, normalisation, inputs,
    tokens seen and FLOPs (3 x forward per update, 1 x for a frozen probe), seed, resolved config."""
    from bertkit.finetune.card import forward_flops
    from bertkit.tasks import get_task

    out = tmp_path / "run"
    kw = dict(freeze=True, probe_features="last", probe_pooling="mean") if freeze else {}
    result = finetune(cfg(task="sst2", data=str(sst_dir), model=str(tiny_model), out=str(out), epochs=1, seed=7,
                          **kw))
    card = json.loads((out / "run_card.json").read_text())
    assert card["mode"] == ("frozen-feature probe" if freeze else "full fine-tuning")
    assert card["probe"] == ({"features": "last", "combine": "concat", "layers": [2], "pooling": "mean"}
                             if freeze else None)
    assert card["attention"] == "bidirectional" and card["normalization"] == "post-LN"
    assert card["seed"] == 7 and card["config"]["seed"] == 7 and card["config"]["task"] == "sst2"
    assert card["trainable_parameters"] < card["parameters"] if freeze else \
        card["trainable_parameters"] == card["parameters"]
    # one epoch of 320 examples (20 updates of 16, packed): every training input once
    task = get_task("sst2")
    tok = Tokenizer.from_dir(tiny_model)
    lengths = [len(f["input_ids"]) for f in task.featurize(task.read(sst_dir / "train.tsv"), tok, ["0", "1"],
                                                           max_length=32)]
    assert card["tokens_seen"] == result["tokens_seen"] == sum(lengths)
    config = load_model(out).config
    forward = forward_flops(config, sum(lengths), sum(n * n for n in lengths))
    assert card["train_flops"] == pytest.approx(forward * (1 if freeze else 3))
    assert card["eval_flops"] > 0 and card["updates"] == 20
    md = (out / "run_card.md").read_text()
    assert "| frozen probe or full fine-tuning | " + card["mode"] in md
    assert "| attention direction | bidirectional |" in md and "longest-first truncation" in md


def test_run_card_records_a_causal_model(tiny_model, sst_dir, tmp_path):
    from bertkit.checkpoint import read_config
    src = tmp_path / "causal"
    model = load_model(tiny_model, head="encoder")
    model.config.causal = True                       # saved as bertkit_causal: the run builds causal attention
    save_model(model, src)
    Tokenizer.from_dir(tiny_model).save(src)
    assert read_config(src)[0].causal
    finetune(cfg(task="sst2", data=str(sst_dir), model=str(src), out=str(tmp_path / "run"), epochs=1))
    card = json.loads((tmp_path / "run" / "run_card.json").read_text())
    assert card["attention"] == "causal (left-to-right)"


def test_mean_pooling_trains_travels_with_the_checkpoint_and_is_refused_where_nothing_pools(
        tiny_model, sst_dir, conll_dir, tmp_path, capsys):
    out = tmp_path / "mean"
    result = finetune(cfg(task="sst2", data=str(sst_dir), model=str(tiny_model), out=str(out), pooling="mean"))
    assert result["dev"]["accuracy"] >= 0.95, result["history"]
    config = json.loads((out / "config.json").read_text())
    assert config["classifier_pooling"] == "mean"
    ours = load_model(out).eval()
    assert ours.config.classifier_pooling == "mean"
    # the pooler reads the mean of the real tokens' states: padded, packed and by hand agree
    tok = Tokenizer.from_dir(out)
    batch = tok(["the movie was good", "a bad plot and it is very poor"])
    with torch.no_grad():
        logits, _ = ours(**batch)
        h = ours.bert(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        m = batch["attention_mask"][..., None].float()
        by_hand = ours.classifier(torch.tanh(ours.bert.pooler((h * m).sum(1) / m.sum(1))))
        torch.testing.assert_close(logits, by_hand, atol=1e-5, rtol=1e-4)
        cls_logits = ours.classifier(torch.tanh(ours.bert.pooler(h[:, 0])))
        assert not torch.allclose(logits, cls_logits, atol=1e-3)     # not the [CLS] reading
    # evaluate (the padding-free Predictor) re-computes the saved checkpoint's dev metric exactly
    assert main(["evaluate", "--model", str(out), "--data", str(sst_dir / "dev.tsv"), "--json"]) == 0
    ev = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert ev["accuracy"] == pytest.approx(result["dev"]["accuracy"])
    # a random-init baseline pools the same way; tagging has no pooler to choose for
    base = tmp_path / "mean_random"
    finetune(cfg(task="sst2", data=str(sst_dir), model=str(tiny_model), out=str(base), pooling="mean",
                 init="random", epochs=1))
    assert json.loads((base / "config.json").read_text())["classifier_pooling"] == "mean"
    assert main(["finetune", "--task", "conll2003", "--data", str(conll_dir), "--model", str(tiny_model),
                 "--out", str(tmp_path / "ner"), "--pooling", "mean", "--no-progress"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pooling" in err[0] and "conll2003" in err[0], err


def test_dropout_option_sets_the_fine_tuning_dropout_and_is_recorded(tiny_model, sst_dir, tmp_path):
    """--dropout overrides the checkpoint's dropout for fine-tuning (the CPU recipes pre-train with
    it off; the paper fine-tunes with 0.1); the run card and the saved config.json say what ran."""
    from bertkit.finetune import build_model
    from bertkit.tasks import get_task

    task = get_task("sst2")
    for init in ("pretrained", "random"):
        m = build_model(task, cfg(task="sst2", model=str(tiny_model), init=init, dropout=0.25), ["0", "1"])
        rates = {mod.p for mod in m.modules() if isinstance(mod, torch.nn.Dropout)}
        assert rates == {0.25} and m.config.attention_dropout == 0.25, (init, rates)
        assert all(b.attn.dropout == 0.25 for b in m.bert.blocks)
    out = tmp_path / "d"
    finetune(cfg(task="sst2", data=str(sst_dir), model=str(tiny_model), out=str(out), dropout=0.0, epochs=1))
    card = json.loads((out / "run_card.json").read_text())
    assert card["dropout"] == {"hidden": 0.0, "attention": 0.0, "head": 0.0} and card["pooling"] == "cls"
    saved = json.loads((out / "config.json").read_text())
    assert saved["hidden_dropout_prob"] == saved["attention_probs_dropout_prob"] == 0.0
    with pytest.raises(Exception, match=r"dropout must be a probability in \[0, 1\)"):
        cfg(task="sst2", dropout=1.0)


def test_layer_lr_decay_reaches_the_training_loop(tiny_model, sst_dir, tmp_path):
    """With a tiny decay the embeddings (lr x decay^(L+1)) stay where they were while the head
    trains; the run card records the decay."""
    from safetensors.torch import load_file

    out = tmp_path / "llrd"
    finetune(cfg(task="sst2", data=str(sst_dir), model=str(tiny_model), out=str(out), epochs=1,
                 layer_lr_decay=1e-3))
    before, after = load_file(tiny_model / "model.safetensors"), load_file(out / "model.safetensors")
    def change(suffix: str) -> float:
        a, b = (next(t for k, t in sd.items() if k.endswith(suffix)) for sd in (after, before))
        return float((a - b).abs().max())
    assert change("word_embeddings.weight") < 1e-6
    assert 1e-8 < change("layer.1.output.dense.weight") < 1e-3          # the last block: lr x 1e-3
    assert change("pooler.dense.weight") > 1e-3                            # above the blocks: the full rate
    assert json.loads((out / "run_card.json").read_text())["layer_lr_decay"] == 1e-3
    with pytest.raises(Exception, match="layer_lr_decay"):
        cfg(task="sst2", layer_lr_decay=0.0)


def test_precision_and_attention_kernel_reach_the_training_steps_and_are_recorded(tiny_model, sst_dir, tmp_path, monkeypatch):
    """precision=bf16 trains under bf16 autocast (fp32 weights) and learns as fp32 does; 'auto'
    follows the measured bf16 speed (BERTKIT_BF16 forces it here); the run card and metrics.json
    say what ran."""
    import bertkit.finetune as ft

    seen = []
    real = ft.run_batch

    def spy(model, *a, **k):
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else torch.float32)
        return real(model, *a, **k)

    monkeypatch.setattr(ft, "run_batch", spy)
    monkeypatch.setenv("BERTKIT_BF16", "1")          # bf16 counted as fast: the test runs alike on every CPU
    results = {}
    for precision in ("fp32", "bf16", "auto"):
        seen.clear()
        out = tmp_path / precision
        results[precision] = finetune(cfg(task="sst2", data=str(sst_dir), model=str(tiny_model), out=str(out),
                                          precision=precision))
        card = json.loads((out / "run_card.json").read_text())
        want = "float32" if precision == "fp32" else "bfloat16"
        assert set(seen) == {torch.float32 if precision == "fp32" else torch.bfloat16}, precision
        assert card["precision"] == results[precision]["precision"] == want
        assert card["precision_reason"].startswith("auto" if precision == "auto" else "asked")
        assert card["attention_kernel"] in ("sdpa", "math")
        assert f"| precision | {want}" in (out / "run_card.md").read_text()
    assert results["bf16"]["dev"]["accuracy"] >= 0.95 and results["fp32"]["dev"]["accuracy"] >= 0.95
    monkeypatch.setenv("BERTKIT_BF16", "0")
    assert finetune(cfg(task="sst2", data=str(sst_dir), model=str(tiny_model), out=str(tmp_path / "slow"),
                        epochs=1))["precision"] == "float32"
    # --attention pins the kernel as pre-training's train.attention does (with --precision: one result everywhere)
    for kernel in ("sdpa", "math"):
        out = tmp_path / f"kernel-{kernel}"
        finetune(cfg(task="sst2", data=str(sst_dir), model=str(tiny_model), out=str(out), epochs=1,
                     precision="fp32", attention=kernel))
        card = json.loads((out / "run_card.json").read_text())
        assert (card["attention_kernel"], card["attention_kernel_reason"]) == (kernel, f"asked: {kernel}")
