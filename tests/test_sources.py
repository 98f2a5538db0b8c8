"""Data a newcomer has: dataset names (the `datasets` library) and Parquet / Arrow / JSONL / CSV
tables, for fine-tuning tasks and pre-training text. Local files only: nothing here reaches a hub."""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from bertkit.errors import BertkitError
from bertkit import sources
from bertkit.sources import DatasetName, dataset_name, open_table
from bertkit.tasks import BadRows, DataError, get_task

pa = pytest.importorskip("pyarrow", reason="needs pyarrow (the 'datasets' extra: pip install 'bertkit[datasets]')")
import pyarrow.ipc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[1] / "src" / "bertkit" / "sample" / "inaugural.txt.gz"

# rows as the Hub's nyu-mll/glue (sst2) lays them out; label 1 = positive
SST2 = {"sentence": ["a gripping , funny film", "dull and long", "fine acting"], "label": [1, 0, 1], "idx": [0, 1, 2]}
HF_META = {b"huggingface": json.dumps({"info": {"features": {
    "sentence": {"dtype": "string", "_type": "Value"},
    "label": {"names": ["negative", "positive"], "_type": "ClassLabel"},
    "idx": {"dtype": "int32", "_type": "Value"}}}}).encode()}


def write_parquet(path: Path, columns: dict, meta: dict | None = None) -> Path:
    table = pa.table(columns)
    if meta:
        table = table.replace_schema_metadata(meta)
    pq.write_table(table, path)
    return path


def write_arrow(path: Path, columns: dict, stream: bool, meta: dict | None = None) -> Path:
    table = pa.table(columns)
    if meta:
        table = table.replace_schema_metadata(meta)
    new = pa.ipc.new_stream if stream else pa.ipc.new_file
    with new(str(path), table.schema) as w:
        w.write_table(table)
    return path


def write_saved(folder: Path, columns: dict, meta: dict) -> Path:
    """A folder as Dataset.save_to_disk writes it: state.json, dataset_info.json, an Arrow stream."""
    folder.mkdir(parents=True)
    write_arrow(folder / "data-00000-of-00001.arrow", columns, stream=True)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    (folder / "dataset_info.json").write_text(json.dumps({"features": json.loads(meta[b"huggingface"])["info"]["features"]}))
    return folder


def as_tuples(examples):
    return [(e.id, e.text, e.pair, e.label) for e in examples]


# ---- names ----------------------------------------------------------------------------------------
def test_dataset_names_spell_load_dataset_arguments(tmp_path, monkeypatch):
    assert dataset_name("nyu-mll/glue:sst2:train") == DatasetName("nyu-mll/glue", "sst2", "train")
    assert dataset_name("rajpurkar/squad::validation") == DatasetName("rajpurkar/squad", None, "validation")
    assert dataset_name("nyu-mll/glue:sst2:train[:10%]").split == "train[:10%]"
    assert str(DatasetName("rajpurkar/squad", None, "validation")) == "rajpurkar/squad::validation"
    # local paths are never names: existing, relative with ./.., absolute, globs, file-like, first folder here
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "glue").mkdir()
    for local in ("glue", "./glue", "/abs/glue", "data/*.parquet", "train.tsv", "x.parquet", "runs/mrpc",
                  "../shared/data/glue/SST-2"):
        assert dataset_name(local) is None, local


def test_missing_datasets_extra_is_a_one_line_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(BertkitError, match=r"pip install 'bertkit\[datasets\]'") as e:
        get_task("sst2").read("nyu-mll/glue:sst2:train", BadRows())
    assert "\n" not in str(e.value)


def test_dataset_name_goes_through_load_dataset(monkeypatch):
    datasets = pytest.importorskip("datasets", reason="needs the datasets library (pip install 'bertkit[datasets]')")
    features = datasets.Features({"premise": datasets.Value("string"), "hypothesis": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["entailment", "neutral", "contradiction"]),
                                  "idx": datasets.Value("int32")})
    calls = []

    def fake_load(path, name=None, split=None, **kw):    # what the Hub would answer, built locally
        calls.append((path, name, split))
        return datasets.Dataset.from_dict({"premise": ["a man sleeps", "a dog runs"], "hypothesis": ["he rests", "a cat"],
                                           "label": [0, 2], "idx": [7, 8]}, features=features)
    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    monkeypatch.setattr(sources, "_unreachable_hub", lambda *a: None)        # as if online
    task = get_task("mnli")
    path = task.split_path("nyu-mll/glue:mnli", "dev")
    assert str(path) == "nyu-mll/glue:mnli:validation_matched"
    ex = task.read(path, BadRows())
    assert calls == [("nyu-mll/glue", "mnli", "validation_matched")]
    assert as_tuples(ex) == [("7", "a man sleeps", "he rests", "entailment"), ("8", "a dog runs", "a cat", "contradiction")]


def test_load_dataset_errors_are_one_line(monkeypatch):
    datasets = pytest.importorskip("datasets", reason="needs the datasets library (pip install 'bertkit[datasets]')")

    def fail(*a, **kw):
        raise ValueError("Config name is missing.\nPlease pick one among the available configs: ['cola', 'sst2']")
    monkeypatch.setattr(datasets, "load_dataset", fail)
    monkeypatch.setattr(sources, "_unreachable_hub", lambda *a: None)        # as if online
    with pytest.raises(BertkitError, match=r"nyu-mll/glue::train: .*Config name is missing\.$"):
        get_task("sst2").read("nyu-mll/glue::train", BadRows())


def test_a_name_the_hub_cannot_be_reached_for_fails_at_once(tmp_path, monkeypatch):
    """A mistyped local folder that reads as a dataset name, on a machine without the Hub: one line at
    once, not load_dataset's ~25 s of retries (and their 20 lines of warnings)."""
    import socket

    datasets = pytest.importorskip("datasets", reason="needs the datasets library (pip install 'bertkit[datasets]')")

    def unreachable(*a, **kw):
        raise socket.gaierror(-2, "Name or service not known")

    def never(*a, **kw):
        raise AssertionError("load_dataset called")
    monkeypatch.setattr(socket, "getaddrinfo", unreachable)
    monkeypatch.setattr(datasets, "load_dataset", never)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BertkitError, match=r"^glue/SST-2x::train: not a local file or folder, and as a dataset "
                                           r"name it needs the Hub \(huggingface.co\), which this machine cannot "
                                           r"reach") as e:
        get_task("sst2").read(get_task("sst2").split_path("glue/SST-2x", "train"), BadRows())
    assert "\n" not in str(e.value)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")                # offline mode: datasets reads its cache itself
    with pytest.raises(BertkitError, match="could not load it: load_dataset called"):
        get_task("sst2").read("glue/SST-2x::train", BadRows())


# ---- GLUE from tables -------------------------------------------------------------------------------
def test_every_table_format_reads_the_same_examples(tmp_path):
    task = get_task("sst2")
    want = [("0", "a gripping , funny film", None, "1"), ("1", "dull and long", None, "0"), ("2", "fine acting", None, "1")]
    files = [write_parquet(tmp_path / "a.parquet", SST2, HF_META),
             write_parquet(tmp_path / "plain.parquet", SST2),                       # no class names: ids are GLUE's
             write_arrow(tmp_path / "a.arrow", SST2, stream=False, meta=HF_META),
             write_arrow(tmp_path / "s.arrow", SST2, stream=True, meta=HF_META),
             write_saved(tmp_path / "saved", SST2, HF_META)]
    rows = [dict(zip(SST2, r)) for r in zip(*SST2.values())]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps({**r, "label": ["negative", "positive"][r["label"]]}) + "\n" for r in rows))
    (tmp_path / "a.csv").write_text("sentence,label,idx\n" + "".join(f'"{r["sentence"]}",{r["label"]},{r["idx"]}\n'
                                                                    for r in rows))
    (tmp_path / "array.json").write_text(json.dumps(rows))
    files += [tmp_path / "a.jsonl", tmp_path / "a.csv", tmp_path / "array.json"]
    for f in files:
        assert as_tuples(task.read(f, BadRows())) == want, f
    # class names instead of ids: "positive" is SST-2's "1" only when the table says so (ClassLabel names)
    write_parquet(tmp_path / "named.parquet", {**SST2, "label": ["positive", "negative", "positive"]}, HF_META)
    assert as_tuples(task.read(tmp_path / "named.parquet", BadRows())) == want
    with pytest.raises(DataError, match=r"b\.jsonl\.gz: row 0: label 'positive' is not a class of this task"):
        task.read(tmp_path / "b.jsonl.gz", BadRows())


def test_glue_labels_follow_the_task_files(tmp_path):
    # MNLI: the Hub's class ids 0/1/2 are entailment/neutral/contradiction, as GLUE's TSV spells them
    cols = {"premise": ["p1", "p2", "p3", "p4"], "hypothesis": ["h1", "h2", "h3", "h4"], "label": [0, 1, 2, -1],
            "idx": [0, 1, 2, 3]}
    ex = get_task("mnli").read(write_parquet(tmp_path / "m.parquet", cols), BadRows())
    assert [e.label for e in ex] == ["entailment", "neutral", "contradiction", None]     # -1: a test row
    # STS-B: a score; MRPC with GLUE's own TSV header names
    st = get_task("stsb").read(write_parquet(tmp_path / "s.parquet", {"sentence1": ["a"], "sentence2": ["b"],
                                                                       "label": [3.8], "idx": [5]}), BadRows())
    assert (st[0].id, st[0].label) == ("5", pytest.approx(3.8))
    mr = get_task("mrpc").read(write_parquet(tmp_path / "mr.parquet", {"#1 String": ["x"], "#2 String": ["y"],
                                                                        "Quality": ["1"]}), BadRows())
    assert as_tuples(mr) == [("0", "x", "y", "1")]


def test_bad_rows_name_the_table_and_row(tmp_path):
    f = write_parquet(tmp_path / "bad.parquet", {"sentence": ["ok", "", "fine"], "label": [1, 0, 7]})
    with pytest.raises(DataError, match=r"bad\.parquet: row 1: empty sentence \(--skip-bad-rows"):
        get_task("sst2").read(f, BadRows())
    bad = BadRows(skip=True)
    assert [e.text for e in get_task("sst2").read(f, bad)] == ["ok"] and bad.count == 2
    wrong = write_parquet(tmp_path / "wrong.parquet", {"question": ["q"], "answer": ["a"]})
    with pytest.raises(DataError, match=r"wrong\.parquet: no sentence column for the text \(has: question, answer\); "
                                        r"is this sst2's data\?"):
        get_task("sst2").read(wrong, BadRows())


def test_split_path_finds_tables_in_a_folder(tmp_path):
    task = get_task("sst2")
    hub = tmp_path / "hub"                       # the Hub's Parquet layout: SPLIT-0000k-of-0000n.parquet
    hub.mkdir()
    write_parquet(hub / "train-00000-of-00002.parquet", {k: v[:2] for k, v in SST2.items()})
    write_parquet(hub / "train-00001-of-00002.parquet", {k: v[2:] for k, v in SST2.items()})
    write_parquet(hub / "validation-00000-of-00001.parquet", SST2)
    assert [e.text for e in task.read(task.split_path(hub, "train"), BadRows())] == SST2["sentence"]
    assert task.split_path(hub, "dev").name == "validation-*.parquet"
    saved = tmp_path / "dd"                      # DatasetDict.save_to_disk: one folder per split
    write_saved(saved / "train", SST2, HF_META)
    write_saved(saved / "validation", SST2, HF_META)
    (saved / "dataset_dict.json").write_text('{"splits": ["train", "validation"]}')
    assert task.split_path(saved, "dev") == saved / "validation"
    with pytest.raises(BertkitError, match="a DatasetDict folder; name one split"):
        open_table(saved)
    with pytest.raises(DataError, match=r"no dev\.tsv \(or dev\.tsv\.gz or validation\.parquet"):
        task.split_path(_empty(tmp_path), "dev")


def _empty(tmp_path: Path) -> Path:
    d = tmp_path / "empty"
    d.mkdir()
    return d


def test_native_files_still_go_to_the_task_reader(tmp_path):
    (tmp_path / "train.tsv").write_text("sentence\tlabel\ngood film\t1\n")
    assert as_tuples(get_task("sst2").read(tmp_path / "train.tsv", BadRows())) == [("0", "good film", None, "1")]
    squad = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": "Paris is in France.", "qas": [
        {"id": "q1", "question": "Where is Paris?", "answers": [{"text": "France", "answer_start": 12}]}]}]}]}
    (tmp_path / "dev.json").write_text(json.dumps(squad))
    assert get_task("squad").read(tmp_path / "dev.json", BadRows())[0].answers == [("France", 12)]


# ---- NER, SQuAD, SWAG ---------------------------------------------------------------------------------
def test_conll_squad_swag_from_hub_columns(tmp_path):
    ner_meta = {b"huggingface": json.dumps({"info": {"features": {"ner_tags": {"_type": "List", "feature": {
        "_type": "ClassLabel", "names": ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]}}}}}).encode()}
    f = write_parquet(tmp_path / "ner.parquet", {"id": ["0", "1"], "tokens": [["EU", "rejects"], ["Peter", "Blackburn"]],
                                                 "ner_tags": [[3, 0], [1, 2]]}, ner_meta)
    ex = get_task("conll2003").read(f, BadRows())
    assert [(e.words, e.tags) for e in ex] == [(["EU", "rejects"], ["B-ORG", "O"]), (["Peter", "Blackburn"], ["B-PER", "I-PER"])]

    ctx = "Paris is the capital of France."
    q = {"id": ["a", "b"], "title": ["Paris", "Paris"], "context": [ctx, ctx], "question": ["Capital of?", "Size?"],
         "answers": [{"text": ["France"], "answer_start": [24]}, {"text": [], "answer_start": []}]}
    f = write_parquet(tmp_path / "squad2.parquet", q)
    ex = get_task("squad2").read(f, BadRows())
    assert [(e.id, e.answers, e.is_impossible) for e in ex] == [("a", [("France", 24)], False), ("b", [], True)]
    with pytest.raises(DataError, match="no answers"):          # v1.1 questions all have one
        get_task("squad").read(f, BadRows())
    wrong = write_parquet(tmp_path / "w.parquet", {**q, "answers": [{"text": ["Spain"], "answer_start": [24]}] * 2})
    with pytest.raises(DataError, match="does not match the context"):
        get_task("squad2").read(wrong, BadRows())

    swag = {"sent1": ["He opens the door."], "sent2": ["He"], "ending0": ["walks in."], "ending1": ["eats it."],
            "ending2": ["flies."], "ending3": ["sings."], "label": [0]}
    ex = get_task("swag").read(write_parquet(tmp_path / "swag.parquet", swag), BadRows())
    assert (ex[0].context, ex[0].start, ex[0].endings[0], ex[0].label) == ("He opens the door.", "He", "walks in.", 0)


def test_custom_tasks_read_tables_with_class_names(tmp_path):
    from bertkit.tasks.custom import custom_task
    f = write_parquet(tmp_path / "reviews.parquet", {"review": ["great", "awful"], "stars": [1, 0]},
                      {b"huggingface": json.dumps({"info": {"features": {"stars": {
                          "_type": "ClassLabel", "names": ["bad", "good"]}}}}).encode()})
    ex = custom_task("classify", text_column="review", label_column="stars").read(f, BadRows())
    assert [(e.text, e.label) for e in ex] == [("great", "good"), ("awful", "bad")]


# ---- pre-training text ------------------------------------------------------------------------------
def _documents(n: int) -> list[list[str]]:
    text = gzip.open(SAMPLE, "rt", encoding="utf-8").read()
    docs = [[s for s in d.split("\n") if s.strip()] for d in text.split("\n\n")]
    return [d for d in docs if d][:n]


def test_prepare_reads_a_table_as_it_reads_the_same_text(tmp_path):
    from bertkit.data.prepare import PrepareConfig, prepare
    from bertkit.tokenizer import Tokenizer

    docs = _documents(8)
    (tmp_path / "corpus.txt").write_text("\n\n".join("\n".join(d) for d in docs) + "\n")
    write_parquet(tmp_path / "corpus.parquet", {"id": list(range(len(docs))), "text": ["\n".join(d) for d in docs]})
    write_arrow(tmp_path / "corpus.arrow", {"text": ["\n".join(d) for d in docs]}, stream=True)
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps({"text": "\n".join(d)}) + "\n" for d in docs))
    tok = Tokenizer.train([tmp_path / "corpus.txt"], vocab_size=400)
    # the same words learnt (the order of equally frequent merges is the trainer's own)
    assert set(Tokenizer.train([tmp_path / "corpus.parquet"], vocab_size=400).vocab) == set(tok.vocab)
    metas = {}
    for name in ("corpus.txt", "corpus.parquet", "corpus.arrow", "corpus.jsonl"):
        metas[name] = prepare([str(tmp_path / name)], tok, tmp_path / name.replace(".", "_"), PrepareConfig(),
                              progress=False)
    ref = tmp_path / "corpus_txt"
    for name in ("corpus_parquet", "corpus_arrow", "corpus_jsonl"):
        for f in sorted(ref.glob("shard-*/*.npy")):
            assert np.array_equal(np.load(f), np.load(tmp_path / name / f.relative_to(ref))), (name, f.name)
    assert metas["corpus.parquet"]["counts"]["instances"] == metas["corpus.txt"]["counts"]["instances"] > 0


def test_prepare_input_errors_are_one_line(tmp_path):
    from bertkit.data.text import expand_inputs
    from bertkit.sources import table_documents
    from bertkit.data.text import TextCounts

    f = write_parquet(tmp_path / "two.parquet", {"title": ["a"], "body": ["b"]})
    with pytest.raises(BertkitError, match=r"two\.parquet: which column is the text\? .*several hold strings: title, body"):
        list(table_documents(f, TextCounts()))
    folder = tmp_path / "shards"                       # a folder of Parquet shards and no .txt: its tables
    folder.mkdir()
    write_parquet(folder / "train-00000-of-00002.parquet", {"text": ["a b"]})
    write_parquet(folder / "train-00001-of-00002.parquet", {"text": ["c d"]})
    assert [p.name for p in expand_inputs([str(folder)])] == ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]


def test_a_json_object_file_reads_with_a_bom_and_anything_else_is_one_line_naming_the_file(tmp_path):
    from bertkit.checkpoint import CheckpointError

    f = tmp_path / "config.json"
    f.write_bytes(b"\xef\xbb\xbf" + json.dumps({"hidden_size": 8}).encode())    # Windows editors write a BOM
    assert sources.read_json_object(f) == {"hidden_size": 8}
    for body, says in ((b'{"a": 1,\n "b": }', "config.json:2: not valid JSON"), (b"[1, 2]", "got list"),
                       (b'{"a": "\xff"}', "not valid UTF-8 (byte 7)"), (b"[" * 100_000, "nested too deeply")):
        f.write_bytes(body)
        with pytest.raises(CheckpointError) as e:
            sources.read_json_object(f, CheckpointError)
        assert says in str(e.value) and str(f) in str(e.value) and "\n" not in str(e.value)
