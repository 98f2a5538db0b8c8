"""`bertkit score` on the real shared files: the references are read here independently (csv with
QUOTE_NONE as the official GLUE loaders, plain column parsing for CoNLL, json for SQuAD) and the
expected figures come from scikit-learn, scipy, seqeval and the official SQuAD evaluation."""
from __future__ import annotations

import csv
import gzip
import io
import json
import random
import warnings

import pytest

from bertkit.cli import main

sk = pytest.importorskip("sklearn.metrics")
stats = pytest.importorskip("scipy.stats")
seqeval_metrics = pytest.importorskip("seqeval.metrics")

from test_metrics import v11_evaluate, v20_evaluate  # noqa: E402  (the official scripts' logic)

# task, folder, has header, id column, label column
GLUE = [("mrpc", "MRPC", True, None, "Quality"), ("cola", "CoLA", False, None, 1),
        ("stsb", "STS-B", True, "index", "score"), ("sst2", "SST-2", True, None, "label"),
        ("rte", "RTE", True, "index", "label")]


def glue_references(path, has_header, id_col, label_col) -> list[tuple[str, str]]:
    """(id, label) rows, read as GLUE's own processors do (tab-separated, no quote handling)."""
    text = gzip.open(path, "rb").read().decode("utf-8-sig")
    rows = list(csv.reader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE))
    header, data = (rows[0], rows[1:]) if has_header else (None, rows)
    lab = header.index(label_col) if isinstance(label_col, str) else label_col
    ids = [r[header.index(id_col)] for r in data] if id_col else [str(i) for i in range(len(data))]
    return [(i, r[lab]) for i, r in zip(ids, data)]


def score(capsys, *args) -> tuple[int, dict | str]:
    rc = main(["score", *map(str, args), "--json"])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else err)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps({"id": i, "prediction": p}) + "\n" for i, p in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("task,folder,has_header,id_col,label_col", GLUE, ids=[g[0] for g in GLUE])
def test_glue_perfect_and_perturbed(task, folder, has_header, id_col, label_col, shared_data, tmp_path, capsys):
    ref_path = shared_data / "glue" / folder / "dev.tsv.gz"
    refs = glue_references(ref_path, has_header, id_col, label_col)
    rc, perfect = score(capsys, "--task", task, "--predictions", write_jsonl(tmp_path / "p.jsonl", refs),
                        "--references", ref_path)
    assert rc == 0
    main_key = {"mrpc": "f1", "cola": "mcc", "stsb": "spearman", "sst2": "accuracy", "rte": "accuracy"}[task]
    assert perfect[main_key] == pytest.approx(1.0)

    rng = random.Random(task)
    labels = sorted({lab for _, lab in refs})
    if task == "stsb":
        y_true = [float(lab) for _, lab in refs]
        y_pred = [round(min(5, max(0, y + rng.gauss(0, 1))), rng.choice([0, 3])) for y in y_true]
        preds = [(i, y) for (i, _), y in zip(refs, y_pred)]
    else:
        y_true = [lab for _, lab in refs]
        y_pred = [lab if rng.random() < 0.75 else rng.choice(labels) for lab in y_true]
        # mixed spellings of the same class: 1, 1.0 and "1" all mean "1"
        preds = [(i, int(p) if p.isdigit() and rng.random() < 0.5 else p) for (i, _), p in zip(refs, y_pred)]
    rng.shuffle(preds)                                                  # order does not matter, ids do
    rc, got = score(capsys, "--task", task, "--predictions", write_jsonl(tmp_path / "q.jsonl", preds),
                    "--references", ref_path)
    assert rc == 0
    if task == "stsb":
        assert got["pearson"] == pytest.approx(stats.pearsonr(y_true, y_pred)[0], abs=1e-12)
        assert got["spearman"] == pytest.approx(stats.spearmanr(y_true, y_pred)[0], abs=1e-12)
        return
    assert got["accuracy"] == pytest.approx(sk.accuracy_score(y_true, y_pred), abs=1e-12)
    if task == "mrpc":
        assert got["f1"] == pytest.approx(sk.f1_score(y_true, y_pred, pos_label="1"), abs=1e-12)
    if task == "cola":
        assert got["mcc"] == pytest.approx(sk.matthews_corrcoef(y_true, y_pred), abs=1e-12)


def test_mrpc_keeps_bom_and_quotes(shared_data):
    """The shared MRPC file starts with a BOM and SST-2-like files carry bare quote characters;
    the task reader must see the same rows as the QUOTE_NONE reader above."""
    from bertkit.tasks import get_task
    path = shared_data / "glue" / "MRPC" / "dev.tsv.gz"
    assert gzip.open(path, "rb").read(3) == b"\xef\xbb\xbf"
    ours = get_task("mrpc").read(path)
    refs = glue_references(path, True, None, "Quality")
    assert [(e.id, e.label) for e in ours] == refs
    assert any('"' in e.text or '"' in (e.pair or "") for e in ours)


def test_row_numbers_for_a_file_with_an_id_column(shared_data, tmp_path, capsys, caplog):
    path = shared_data / "glue" / "STS-B" / "dev.tsv.gz"
    refs = glue_references(path, True, "index", "score")
    assert refs[0][0] != "0"                                             # the index column is not the row
    rc, got = score(capsys, "--task", "stsb", "--predictions",
                    write_jsonl(tmp_path / "p.jsonl", [(n, float(lab)) for n, (_, lab) in enumerate(refs)]),
                    "--references", path)
    assert rc == 0 and got["pearson"] == pytest.approx(1.0)
    assert "matching by row" in caplog.text


def test_glue_errors(shared_data, tmp_path, capsys):
    path = shared_data / "glue" / "SST-2" / "dev.tsv.gz"
    refs = glue_references(path, True, None, "label")
    rc, err = score(capsys, "--task", "sst2", "--predictions", write_jsonl(tmp_path / "p.jsonl", refs[:-1]),
                    "--references", path)
    assert rc == 1 and f"no prediction for 1 of {len(refs)} examples (first id '{len(refs) - 1}')" in err
    rc, err = score(capsys, "--task", "sst2", "--predictions",
                    write_jsonl(tmp_path / "p.jsonl", [(i, "positive") for i, _ in refs]), "--references", path)
    assert rc == 1 and "id 0: 'positive' is not one of the references' labels (0, 1)" in err
    (tmp_path / "bad.jsonl").write_text('{"id": 0, "prediction": 1}\n{"id": 1, "prediction": 1\n')
    rc, err = score(capsys, "--task", "sst2", "--predictions", tmp_path / "bad.jsonl", "--references", path)
    assert rc == 1 and "bad.jsonl:2: not valid JSON" in err
    (tmp_path / "dup.jsonl").write_text('{"id": 0, "prediction": 1}\n{"id": "0", "prediction": 0}\n')
    rc, err = score(capsys, "--task", "sst2", "--predictions", tmp_path / "dup.jsonl", "--references", path)
    assert rc == 1 and "dup.jsonl:2: id '0' predicted twice" in err
    broken = tmp_path / "dev.tsv"
    broken.write_text("sentence\tlabel\ngood film .\t1\nno label here\nbad film .\t0\n", encoding="utf-8")
    rc, err = score(capsys, "--task", "sst2", "--predictions",
                    write_jsonl(tmp_path / "p.jsonl", [(0, 1), (1, 0)]), "--references", broken)
    assert rc == 1 and "dev.tsv:3: expected 2 tab-separated columns" in err
    rc, got = score(capsys, "--task", "sst2", "--predictions", write_jsonl(tmp_path / "p.jsonl", [(0, 1), (2, 0)]),
                    "--references", broken, "--skip-bad-rows")
    assert rc == 0 and got == {"accuracy": 1.0, "skipped_rows": 1}


def conll_sentences(path) -> list[list[str]]:
    sents, cur = [], []
    for line in gzip.open(path, "rt", encoding="utf-8"):
        if not line.strip():
            if cur:
                sents.append(cur)
            cur = []
        elif not line.startswith("-DOCSTART-"):
            cur.append(line.split()[-1])
    if cur:
        sents.append(cur)
    return sents


def test_conll_equals_seqeval(shared_data, tmp_path, capsys):
    path = shared_data / "conll2003" / "valid.txt.gz"
    gold = conll_sentences(path)
    rng = random.Random(0)
    tags = sorted({t for s in gold for t in s})
    pred = [[t if rng.random() < 0.9 else rng.choice(tags) for t in s] for s in gold]
    rows = [(i, p if i % 2 else " ".join(p)) for i, p in enumerate(pred)]   # a list, or one string of tags
    rc, got = score(capsys, "--task", "ner", "--predictions", write_jsonl(tmp_path / "p.jsonl", rows),
                    "--references", path)
    assert rc == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert got["f1"] == pytest.approx(seqeval_metrics.f1_score(gold, pred), abs=1e-12)
        assert got["precision"] == pytest.approx(seqeval_metrics.precision_score(gold, pred), abs=1e-12)
        report = seqeval_metrics.classification_report(gold, pred, output_dict=True)
    for t in ("PER", "LOC", "ORG", "MISC"):
        assert got["per_type"][t]["f1"] == pytest.approx(report[t]["f1-score"], abs=1e-12)
        assert got["per_type"][t]["support"] == report[t]["support"]
    rc, perfect = score(capsys, "--task", "conll2003", "--predictions",
                        write_jsonl(tmp_path / "g.jsonl", list(enumerate(gold))), "--references", path)
    assert perfect["f1"] == 1.0
    rows[5] = (5, pred[5][:-1])
    rc, err = score(capsys, "--task", "ner", "--predictions", write_jsonl(tmp_path / "p.jsonl", rows),
                    "--references", path)
    assert rc == 1 and f"id 5: {len(pred[5]) - 1} predicted tags for a sentence of {len(pred[5])} words" in err


def test_squad_v1_official_and_jsonl(shared_data, tmp_path, capsys):
    path = shared_data / "squad" / "dev.json.gz"
    data = json.loads(gzip.open(path, "rt", encoding="utf-8").read())["data"]
    rng = random.Random(1)
    preds = {}
    for a in data:
        for p in a["paragraphs"]:
            for qa in p["qas"]:
                r = rng.random()
                if r < 0.05:
                    continue                                                # unanswered: 0, as the script
                text = rng.choice(qa["answers"])["text"]
                preds[qa["id"]] = text if r < 0.5 else (text.split()[0] if r < 0.75 else p["context"][:20])
    (tmp_path / "predictions.json").write_text(json.dumps(preds), encoding="utf-8")
    expected = v11_evaluate(data, preds)
    rc, got = score(capsys, "--task", "squad", "--predictions", tmp_path / "predictions.json", "--references", path)
    assert rc == 0
    assert got["exact_match"] == pytest.approx(expected["exact_match"], abs=1e-9)
    assert got["f1"] == pytest.approx(expected["f1"], abs=1e-9)
    rc, again = score(capsys, "--task", "squad", "--predictions",
                      write_jsonl(tmp_path / "p.jsonl", list(preds.items())), "--references", path)
    assert again["f1"] == got["f1"]


def test_squad_v2_with_null_odds(shared_data, tmp_path, capsys):
    doc = json.loads(gzip.open(shared_data / "squad" / "dev.json.gz", "rt", encoding="utf-8").read())
    doc["data"] = doc["data"][:2]
    rng = random.Random(2)
    preds, odds = {}, {}
    for a in doc["data"]:
        for p in a["paragraphs"]:
            for qa in p["qas"]:
                qa["is_impossible"] = rng.random() < 0.4
                if qa["is_impossible"]:
                    qa["plausible_answers"], qa["answers"] = qa["answers"], []
                r = rng.random()
                preds[qa["id"]] = "" if r < 0.3 else (qa.get("plausible_answers") or qa["answers"])[0]["text"]
                odds[qa["id"]] = round(rng.gauss(0, 3), 2)
    ref = tmp_path / "dev-v2.0.json"
    ref.write_text(json.dumps(doc), encoding="utf-8")
    (tmp_path / "pred.json").write_text(json.dumps(preds), encoding="utf-8")
    (tmp_path / "odds.json").write_text(json.dumps(odds), encoding="utf-8")
    rc, got = score(capsys, "--task", "squad2", "--predictions", tmp_path / "pred.json", "--references", ref,
                    "--null-odds", tmp_path / "odds.json")
    assert rc == 0
    expected = v20_evaluate(doc["data"], preds, odds)
    assert set(got) == set(expected)
    for k, v in expected.items():
        assert got[k] == pytest.approx(v, abs=1e-9), k
    rc, plain = score(capsys, "--task", "squad2", "--predictions", tmp_path / "pred.json", "--references", ref)
    assert plain == pytest.approx(v20_evaluate(doc["data"], preds))
    del preds[next(iter(preds))]
    (tmp_path / "pred.json").write_text(json.dumps(preds), encoding="utf-8")
    rc, err = score(capsys, "--task", "squad2", "--predictions", tmp_path / "pred.json", "--references", ref)
    assert rc == 1 and "no prediction" in err


def test_human_readable_output(shared_data, tmp_path, capsys):
    path = shared_data / "glue" / "RTE" / "dev.tsv.gz"
    refs = glue_references(path, True, "index", "label")
    assert main(["score", "--task", "rte", "--predictions", str(write_jsonl(tmp_path / "p.jsonl", refs)),
                 "--references", str(path)]) == 0
    assert capsys.readouterr().out.split() == ["accuracy", "1.0000"]


MNLI_HEADER = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
               "sentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label")


def glue_file(tmp_path, task, n, rng):
    """A small file in the official GLUE layout of `task` (quote characters included), and its (id, label) rows."""
    rows, refs = [], []
    for i in range(n):
        s1, s2 = f'He said "no {i}" twice .', f"It's {i} o'clock \" ."
        if task == "qqp":
            lab = rng.choice("01")
            rows.append(f"{1000 + 7 * i}\t{2 * i}\t{2 * i + 1}\t{s1}\t{s2}\t{lab}")
            refs.append((str(1000 + 7 * i), lab))
        elif task in ("mnli", "mnli-mm"):
            lab = rng.choice(["entailment", "neutral", "contradiction"])
            votes = "\t".join(rng.choice(["entailment", "neutral", "contradiction"]) for _ in range(5))
            rows.append(f"{i}\t{i}\t{i}e\tfiction\t( {s1} )\t( {s2} )\t(ROOT {s1})\t(ROOT {s2})\t{s1}\t{s2}\t{votes}\t{lab}")
            refs.append((str(i), lab))
        else:
            lab = rng.choice(["entailment", "not_entailment"]) if task == "qnli" else rng.choice("01")
            rows.append(f"{i}\t{s1}\t{s2}\t{lab}")
            refs.append((str(i), lab))
    header = {"qqp": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate", "mnli": MNLI_HEADER, "mnli-mm": MNLI_HEADER,
              "qnli": "index\tquestion\tsentence\tlabel", "wnli": "index\tsentence1\tsentence2\tlabel"}[task]
    path = tmp_path / f"{task}.tsv"
    path.write_text(header + "\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path, refs


@pytest.mark.parametrize("task", ["qqp", "mnli", "mnli-mm", "qnli", "wnli"])
def test_other_glue_layouts(task, tmp_path, capsys):
    rng = random.Random(task)
    path, refs = glue_file(tmp_path, task, 60, rng)
    labels = sorted({lab for _, lab in refs})
    y_true = [lab for _, lab in refs]
    y_pred = [lab if rng.random() < 0.6 else rng.choice(labels) for lab in y_true]
    rc, got = score(capsys, "--task", task, "--predictions",
                    write_jsonl(tmp_path / "p.jsonl", [(i, p) for (i, _), p in zip(refs, y_pred)]), "--references", path)
    assert rc == 0, got
    assert got["accuracy"] == pytest.approx(sk.accuracy_score(y_true, y_pred), abs=1e-12)
    if task == "qqp":
        assert got["f1"] == pytest.approx(sk.f1_score(y_true, y_pred, pos_label="1"), abs=1e-12)


def test_a_test_file_without_labels_is_an_error(tmp_path, capsys):
    path = tmp_path / "test.tsv"
    path.write_text("index\tsentence1\tsentence2\n0\tA man .\tA person .\n", encoding="utf-8")
    rc, err = score(capsys, "--task", "rte", "--predictions", write_jsonl(tmp_path / "p.jsonl", [(0, "entailment")]),
                    "--references", path)
    assert rc == 1 and "no reference label to score against" in err


def test_prediction_file_forms(tmp_path):
    from bertkit.tasks.metrics import MetricError, read_predictions
    p = tmp_path / "p.json"
    p.write_text(json.dumps([{"id": "a", "prediction_text": "x", "no_answer_probability": 0.25},
                             {"id": 7, "prediction": "y"}]))
    assert read_predictions(p) == ({"a": "x", "7": "y"}, {"a": 0.25})
    p.write_text('{"id": "a", "prediction": "x", "null_odds": -1.5}\n\n{"id": "b", "prediction": ""}\n')
    assert read_predictions(p) == ({"a": "x", "b": ""}, {"a": -1.5})
    p.write_text(json.dumps({"q1": "Denver Broncos", "q2": ""}))
    assert read_predictions(p) == ({"q1": "Denver Broncos", "q2": ""}, {})
    p.write_text(json.dumps({"q1": 3}))
    with pytest.raises(MetricError, match="map question ids to answer strings"):
        read_predictions(p)
    p.write_text('{"id": "a"}\n')
    with pytest.raises(MetricError, match=r"p.json:1: expected an object with \"id\" and \"prediction\""):
        read_predictions(p)
    p.write_text("")
    with pytest.raises(MetricError, match="empty file"):
        read_predictions(p)
