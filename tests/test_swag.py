"""SWAG: the CSV as distributed (rowanz/swagaf data/*.csv), multiple-choice features, accuracy."""
from __future__ import annotations

import csv
import io
import json

import pytest
import torch

from bertkit.cli import main
from bertkit.tasks import BadRows, DataError, collate, get_task
from bertkit.tasks import swag as W
from bertkit.tokenizer import Tokenizer

HEADER = ["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
          "ending0", "ending1", "ending2", "ending3", "label"]
ROWS = [
    ["0", "lsmdc1052_Harry_Potter_and_the_order_of_phoenix-94857", "18313",
     "Students lower their eyes nervously. She", "Students lower their eyes nervously.", "She", "gold",
     "pats her shoulder, then saunters toward someone.", "turns with two students.",
     "walks slowly towards someone.", "wheels around as her dog thunders out.", "2"],
    ["1", "anetv_jkn6uvmqwh4", "4", "He rides the motorcycle down the hall and into the elevator. He",
     "He rides the motorcycle down the hall and into the elevator.", "He", "gen",
     "looks at a mirror in the mirror as he watches someone walk through a door.",
     "stops, listening to a cup of coffee with the seated woman, who's standing.",
     'exits the building and rides the motorcycle into a "fancy" car, then a ride.',
     "pulls the bag out of his pocket and hands it to someone's grandma.", "3"],
    ["2", "anetv_dm5WXFiQZUQ", "18419", "A man is sitting on a roof. He", "A man is sitting on a roof.", "He",
     "gold", "is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
     "is holding a rubik's cube.", "starts pulling up roofing on a roof.", "3"],
]


def swag_csv(rows=ROWS, header=HEADER) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")       # pandas' to_csv quoting: only where needed
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue()


@pytest.fixture
def val_csv(tmp_path):
    p = tmp_path / "val.csv"
    p.write_text(swag_csv(), encoding="utf-8")
    return p


def test_read_as_distributed(val_csv):
    ex = get_task("swag").read(val_csv)
    assert [e.id for e in ex] == ["0", "1", "2"] and [e.label for e in ex] == [2, 3, 3]
    assert ex[1].endings[2] == 'exits the building and rides the motorcycle into a "fancy" car, then a ride.'
    assert ex[0].context == "Students lower their eyes nervously." and ex[0].start == "She"


def test_test_file_without_label(tmp_path):
    p = tmp_path / "test.csv"
    p.write_text(swag_csv([r[:-1] for r in ROWS], HEADER[:-1]), encoding="utf-8")
    ex = W.read_swag(p)
    assert [e.label for e in ex] == [None] * 3
    with pytest.raises(DataError, match="no label to score against"):
        W.metrics_choices({"0": 1, "1": 1, "2": 1}, ex)


def test_bad_rows(tmp_path):
    rows = [list(r) for r in ROWS]
    rows[1][-1] = "7"
    rows[2] = rows[2][:-2]
    p = tmp_path / "bad.csv"
    p.write_text(swag_csv(rows), encoding="utf-8")
    with pytest.raises(DataError, match=r"bad.csv:3: label '7' is not 0, 1, 2 or 3"):
        W.read_swag(p)
    bad = BadRows(skip=True)
    assert len(W.read_swag(p, bad)) == 1 and bad.count == 2
    (tmp_path / "h.csv").write_text("a,b\n1,2\n", encoding="utf-8")
    with pytest.raises(DataError, match="no sent1, sent2, ending0"):
        W.read_swag(tmp_path / "h.csv")
    (tmp_path / "e.csv").write_text("", encoding="utf-8")
    with pytest.raises(DataError, match="empty file"):
        W.read_swag(tmp_path / "e.csv")


def test_features_model_and_accuracy(val_csv, minilm):
    from bertkit.config import preset
    from bertkit.model import BertForMultipleChoice

    tok = Tokenizer.from_dir(minilm)
    task = get_task("swag")
    ex = task.read(val_csv)
    feats = task.featurize(ex, tok, None, max_length=24)
    assert len(feats) == 3 and all(len(f["input_ids"]) == 4 for f in feats)
    f = feats[0]
    for k in range(4):
        enc = tok.encode(ex[0].context, f"{ex[0].start} {ex[0].endings[k]}", max_length=24)
        assert f["input_ids"][k] == enc.input_ids and f["token_type_ids"][k] == enc.token_type_ids
    assert max(len(r) for f in feats for r in f["input_ids"]) <= 24
    batch = collate(feats)
    assert batch["input_ids"].shape[:2] == (3, 4) and batch["labels"].tolist() == [2, 3, 3]
    torch.manual_seed(0)
    model = BertForMultipleChoice(preset("tiny", vocab_size=tok.vocab_size)).eval()
    logits, loss = model(**batch)
    assert logits.shape == (3, 4) and torch.isfinite(loss)
    preds = task.postprocess([row.detach().numpy() for row in logits], feats, ex, None)
    assert preds == {str(i): int(logits[i].argmax()) for i in range(3)}
    assert task.metrics(preds, ex)["accuracy"] == pytest.approx(
        sum(preds[e.id] == e.label for e in ex) / 3)


def test_parse_predict_line():
    ex = W.parse_choices({"context": "A man sits.", "start": "He", "endings": ["runs.", "sleeps."]}, "in:1")
    assert ex.endings == ["runs.", "sleeps."]
    with pytest.raises(DataError, match="endings"):
        W.parse_choices({"context": "A man sits.", "endings": ["x"]}, "in:1")


def test_score_cli(val_csv, tmp_path, capsys):
    preds = tmp_path / "p.jsonl"
    preds.write_text("".join(json.dumps({"id": i, "prediction": p}) + "\n" for i, p in enumerate([2, 0, "3"])))
    assert main(["score", "--task", "swag", "--predictions", str(preds), "--references", str(val_csv), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"accuracy": pytest.approx(2 / 3)}
    preds.write_text("".join(json.dumps({"id": i, "prediction": p}) + "\n" for i, p in enumerate([2, 0, 4])))
    assert main(["score", "--task", "swag", "--predictions", str(preds), "--references", str(val_csv)]) == 1
    assert "id 2: 4 is not a choice index 0..3" in capsys.readouterr().err
