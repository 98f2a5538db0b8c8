"""bertkit prepare: Google-exact NSP builder, packing, determinism across workers, resume, bad input."""
from __future__ import annotations

import gzip
import importlib.util
import random
from pathlib import Path

import numpy as np
import pytest

from bertkit.data.encode import CachedEncoder
from bertkit.data.instances import BuildCounts, Doc, nsp_instances, truncate_pair
from bertkit.data.masking import num_to_predict, MaskingConfig
from bertkit.data.prepare import PrepareConfig, prepare
from bertkit.data.pretraining import open_dataset
from bertkit.data.text import Chunker, split_sentences
from bertkit.errors import BertkitError
from bertkit.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "src" / "bertkit" / "sample" / "inaugural.txt.gz"


def as_doc(sentences: list) -> Doc:
    """A document of sentences of ids, as `prepare` hands them to the builders."""
    off = np.cumsum([0] + [len(x) for x in sentences]).tolist()
    return Doc(np.concatenate([np.asarray(x, dtype=np.int64) for x in sentences] or [np.zeros(0, np.int64)]), off)


def google():
    spec = importlib.util.spec_from_file_location("google_reference", REPO / "benchmarks" / "google_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tok(minilm):
    return Tokenizer.from_dir(minilm)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The first 12 inaugural addresses (~190 KB), plus one short document."""
    d = tmp_path_factory.mktemp("corpus")
    text = gzip.open(SAMPLE, "rt", encoding="utf-8").read().split("\n\n")[:12]
    (d / "a.txt").write_text("\n\n".join(text[:6]) + "\n", encoding="utf-8")
    with gzip.open(d / "b.txt.gz", "wt", encoding="utf-8") as f:
        f.write("\n\n".join(text[6:]) + "\n\nA lone sentence.\n")
    return d


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*.npy"))}


# ---- Google exactness ---------------------------------------------------------------------------
def test_truncate_pair_matches_google():
    g = google()
    for seed in range(200):
        r = random.Random(seed)
        la, lb, m = r.randint(1, 90), r.randint(1, 90), r.randint(2, 80)
        a, b = list(range(la)), list(range(1000, 1000 + lb))
        g.truncate_seq_pair(a, b, m, random.Random(seed))
        (fa, ba), (fb, bb) = truncate_pair(la, lb, m, random.Random(seed))
        assert a == list(range(la))[fa:la - ba] and b == list(range(1000, 1000 + lb))[fb:lb - bb]


def test_nsp_builder_is_google_step_for_step(monkeypatch):
    """With lone_segment='random' and the same random.Random, our instances equal Google's."""
    g = google()
    monkeypatch.setattr(g, "create_masked_lm_predictions", lambda tokens, *a, **k: (tokens, [], []))
    r = np.random.default_rng(0)
    docs = [[list(r.integers(1000, 2000, r.integers(1, 60))) for _ in range(r.integers(1, 12))] for _ in range(40)]
    np_docs = [as_doc(d) for d in docs]
    for max_len, short in ((128, 0.1), (32, 0.5), (16, 0.0)):
        for i in range(len(docs)):
            ours = nsp_instances(np_docs, i, max_len, short, random.Random(i), 1, 2, BuildCounts(), "random")
            theirs = g.create_instances_from_document(docs, i, max_len, short, 0.15, 20, [], random.Random(i), False)
            assert len(ours) == len(theirs)
            for o, t in zip(ours, theirs):
                assert [1 if x == "[CLS]" else 2 if x == "[SEP]" else x for x in t.tokens] == o.tokens.tolist()
                types = [0] * o.b_start + [1] * (len(o.tokens) - o.b_start)
                assert t.segment_ids == types and o.nsp_label == int(t.is_random_next)
                assert len(o.tokens) <= max_len


def test_lone_segment_next_keeps_random_next_at_half():
    r = np.random.default_rng(1)
    docs = [as_doc([r.integers(1000, 2000, 150)]) for _ in range(200)] + \
           [as_doc([r.integers(1000, 2000, 20) for _ in range(3)]) for _ in range(200)]
    for rule, lo, hi in (("next", 0.45, 0.55), ("random", 0.6, 1.0)):
        c = BuildCounts()
        rng = random.Random(0)
        inst = [x for i in range(len(docs)) for x in nsp_instances(docs, i, 128, 0.1, rng, 1, 2, c, rule)]
        assert lo < c.random_next / len(inst) < hi, rule
        for x in inst:
            assert x.tokens[0] == 1 and x.tokens[x.b_start - 1] == 2 and x.tokens[-1] == 2
            assert 2 <= x.b_start < len(x.tokens) - 1 and len(x.tokens) <= 128


# ---- tokenization -------------------------------------------------------------------------------
def test_cached_encoder_equals_rust(tok, shared_data):
    lines = []
    for f in sorted((shared_data / "pretrain").glob("*.txt.gz")):
        with gzip.open(f, "rt", encoding="utf-8") as fh:
            lines += [next(fh).strip() for _ in range(800)]
    lines += ["", "tab\there", "cr\rin", "ctrl\x01x", "x" * 150 + " y", "Café ÉCOLE naïve", "don't stop!!",
              "U.S.A. $3.50 #1 @home ~x", "日本語 text", "a\u00a0b", "\x7f", "   spaced   out  ", "[MASK] [CLS]", "two\nlines", "é"]
    enc = CachedEncoder(tok.backend, tok.lowercase)
    for _ in range(2):                        # cold and warm cache
        ours = enc.encode(lines)
        assert [o.tolist() for o in ours] == tok.encode_ids(lines)
    assert enc.encode([]) == [] and [x.tolist() for x in enc.encode(["", "a"])] == [[], tok.encode_ids(["a"])[0]]


def test_cached_encoder_many_words_and_cased(tok):
    """Enough distinct words to grow the hash table twice; a cased vocabulary takes the cased path."""
    words = [f"{'Ab'[i % 2]}{i:x}z{i % 7}" for i in range(70000)]
    lines = [" ".join(words[k:k + 30]) + "." for k in range(0, len(words), 30)]
    enc = CachedEncoder(tok.backend, tok.lowercase)
    for part in (lines[:1000], lines, lines[500:]):
        assert [o.tolist() for o in enc.encode(part)] == tok.encode_ids(part)
    assert len(enc._start) > 65536 and len(enc._keys) == 1 << 18
    cased = Tokenizer(tok.vocab, lowercase=False)
    enc = CachedEncoder(cased.backend, cased.lowercase)
    assert [o.tolist() for o in enc.encode(lines[:300])] == cased.encode_ids(lines[:300])


def test_sentence_split():
    assert split_sentences('Mr. Smith went to Washington. He said "Hi." Then 3 more came! Why? No.') == \
        ["Mr. Smith went to Washington.", 'He said "Hi."', "Then 3 more came!", "Why?", "No."]
    assert split_sentences("J. R. R. Tolkien wrote it. The end. e.g. not here") == \
        ["J. R. R. Tolkien wrote it.", "The end. e.g. not here"]


def test_long_lines_bounded_by_the_block():
    import io
    from bertkit.data.text import TextCounts, _read_lines
    words = [f"w{i}" for i in range(2000)]
    data = ("first line\n" + " ".join(words) + "\nlast\n").encode()
    c = TextCounts()
    lines = [x for block in _read_lines(io.BytesIO(data), Path("x"), 300, c, False, block=1000) for x in block]
    assert lines[0] == "first line" and lines[-1] == "last" and c.long_lines_split == 1
    assert max(len(x.encode()) for x in lines) <= 300 and " ".join(lines[1:-1]).split() == words
    assert c.bytes == len(data)


def test_chunks_hold_two_documents():
    def chunks(docs, size):
        chunker = Chunker(size)
        return [c for c in map(chunker.add, docs) if c is not None] + chunker.finish()

    docs = [["x" * 100]] * 5
    assert [len(c) for c in chunks(docs, 250)] == [3, 2]
    assert [len(c) for c in chunks(docs[:3], 50)] == [3]   # a 1-doc tail joins the last chunk


# ---- end to end ---------------------------------------------------------------------------------
def test_prepare_nsp_workers_resume_cluster(tok, corpus, tmp_path):
    cfg = PrepareConfig(max_length=64, chunk_mb=0.015, seed=7)
    m1 = prepare([str(corpus)], tok, tmp_path / "w1", cfg, workers=1, progress=False)
    m2 = prepare([str(corpus / "*.txt*")], tok, tmp_path / "w2", cfg, workers=2, progress=False)
    assert m1["counts"]["instances"] == m2["counts"]["instances"] > 200
    assert len(m1["shards"]) >= 4
    assert _files(tmp_path / "w1") == _files(tmp_path / "w2")          # byte-identical
    ds = open_dataset(tmp_path / "w1")
    assert len(ds) == m1["counts"]["instances"] and ds.meta["tokenizer_hash"] == tok.fingerprint()
    assert 0.44 < m1["counts"]["random_next_fraction"] < 0.56
    for i in range(0, len(ds), 7):
        x = ds[i]
        ids, t = x["input_ids"], x["token_type_ids"]
        b = int(np.argmax(t))
        assert len(ids) <= 64 and ids[0] == tok.cls_id and ids[-1] == tok.sep_id and ids[b - 1] == tok.sep_id
        assert (t[b:] == 1).all() and (t[:b] == 0).all() and b >= 2 and len(ids) - b >= 2
        assert ((ids == tok.sep_id).sum(), (ids == tok.cls_id).sum()) == (2, 1)
    # resume: a lost shard and a stale temporary folder; only the lost shard is rebuilt
    import shutil
    shutil.rmtree(tmp_path / "w1" / "shard-00002")
    (tmp_path / "w1" / ".shard-00003.tmp-1").mkdir()
    m3 = prepare([str(corpus)], tok, tmp_path / "w1", cfg, workers=1, progress=False)
    assert m3["counts"]["shards_kept_from_before"] == len(m1["shards"]) - 1
    assert not (tmp_path / "w1" / ".shard-00003.tmp-1").exists()
    assert _files(tmp_path / "w1") == _files(tmp_path / "w2")
    # a cluster of 2 machines writing into one folder reads as the single-machine run
    for part in range(2):
        prepare([str(corpus)], tok, tmp_path / "c", cfg, workers=1, num_shards=2, shard_index=part, progress=False)
    dc = open_dataset(tmp_path / "c")
    assert len(dc) == len(ds) and _files(tmp_path / "c") == _files(tmp_path / "w1")
    assert dc[5]["input_ids"].tolist() == ds[5]["input_ids"].tolist()
    for k in ("instances", "tokens", "random_next", "documents", "bytes"):
        assert dc.meta["counts"][k] == m1["counts"][k], k


def test_prepare_static_whole_word(tok, corpus, tmp_path):
    mc = MaskingConfig(mode="whole_word")
    cfg = PrepareConfig(max_length=128, masking="static", dupe_factor=2, masking_config=mc, chunk_mb=1)
    meta = prepare([str(corpus / "a.txt")], tok, tmp_path / "s", cfg, progress=False)
    ds = open_dataset(tmp_path / "s")
    assert meta["masking"] == "static" and meta["dupe_factor"] == 2
    shown = n_mask = 0
    for i in range(0, len(ds), 3):
        x = ds[i]
        pos, ids = x["masked_lm_positions"], x["masked_lm_ids"]
        assert (np.diff(pos) > 0).all() and len(pos) <= num_to_predict(len(x["input_ids"]) - 3, mc)
        assert not np.isin(ids, [tok.cls_id, tok.sep_id, tok.pad_id]).any()
        assert x["input_ids"][0] == tok.cls_id and x["input_ids"][-1] == tok.sep_id
        shown += len(pos)
        n_mask += int((x["input_ids"][pos] == tok.mask_id).sum())
    assert 0.75 < n_mask / shown < 0.85


def test_prepare_no_nsp_packs_full_sentences(tok, corpus, tmp_path):
    cfg = PrepareConfig(max_length=128, nsp=False, chunk_mb=1)
    meta = prepare([str(corpus / "a.txt")], tok, tmp_path / "p", cfg, progress=False)
    ds = open_dataset(tmp_path / "p")
    lens = ds.lengths()
    assert lens.max() <= 128 and lens.mean() > 90 and (lens > 50).mean() > 0.9
    x = ds[0]
    assert x["nsp_label"] == -1 and not x["token_type_ids"].any()
    # every sentence token is kept: tokens = text tokens + [CLS]/[SEP] per instance + document separators
    text = (corpus / "a.txt").read_text(encoding="utf-8")
    n_text = sum(len(ids) for ids in tok.encode_ids([s for s in text.split("\n") if s.strip()]))
    seps = sum(int((ds[i]["input_ids"][1:-1] == tok.sep_id).sum()) for i in range(len(ds)))
    assert meta["counts"]["tokens"] == n_text + 2 * len(ds) + seps and seps <= 5


def test_fill_packs_every_instance_full_and_keeps_every_token(tok, corpus, tmp_path):
    """--fill: the sentence that does not fit is cut and its rest opens the next instance, so every
    instance but the last is exactly max_length long; the token stream is the one whole-sentence
    packing reads, only cut at other places."""
    from bertkit.data.instances import packed_instances

    text = (corpus / "a.txt").read_text(encoding="utf-8")
    docs = [as_doc(tok.encode_ids([s for s in d.split("\n") if s.strip()])) for d in text.split("\n\n") if d.strip()]
    body = lambda insts: np.concatenate([np.concatenate(x.parts)[1:-1] for x in insts])   # without [CLS] ... [SEP]
    whole, full = BuildCounts(), BuildCounts()
    kept = packed_instances(docs, 64, tok.cls_id, tok.sep_id, whole)
    filled = packed_instances(docs, 64, tok.cls_id, tok.sep_id, full, fill=True)
    # full, but for one short of it where a document ends a token before the instance does
    assert all(x.length in (63, 64) for x in filled[:-1]) and filled[-1].length <= 64
    assert sum(x.length == 64 for x in filled) >= 0.95 * len(filled)
    assert np.mean([x.length for x in kept]) < 60 and len(filled) < len(kept)
    drop_seps = lambda a: a[a != tok.sep_id]             # document separators fall elsewhere at a cut
    assert np.array_equal(drop_seps(body(filled)), drop_seps(body(kept)))
    assert 0.5 * len(filled) < full.sentences_cut <= len(filled) - 1 and whole.sentences_cut == 0
    meta = prepare([str(corpus / "a.txt")], tok, tmp_path / "f", PrepareConfig(max_length=64, nsp=False, fill=True),
                   progress=False)
    lens = open_dataset(tmp_path / "f").lengths()
    assert (lens >= 63).sum() >= len(lens) - 1 and meta["counts"]["sentences_cut"] > 0
    assert meta["config"]["fill"] is True
    # an unfilled config hashes as it did before the option existed
    assert "fill" not in PrepareConfig(nsp=False).to_dict()
    with pytest.raises(BertkitError, match="fill .* needs nsp false"):
        PrepareConfig(fill=True)


def test_bad_inputs(tok, tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / "empty.txt").write_bytes(b"")
    long_line = ("word " * 40000).encode()                          # 200 KB on one line
    (d / "bad.txt").write_bytes(b"Good one.\nBad \xff\xfe byte here.\n\n" + long_line + b"\nEnd.\n\nOne.\n")
    meta = prepare([str(d)], tok, tmp_path / "o", PrepareConfig(max_length=32), progress=False)
    c = meta["counts"]
    assert (c["empty_files"], c["invalid_utf8_lines"], c["long_lines_split"]) == (1, 1, 1)
    assert c["one_sentence_documents"] == 1 and c["documents"] == 3
    with pytest.raises(BertkitError, match=r"bad.txt:2: invalid UTF-8"):
        prepare([str(d / "bad.txt")], tok, tmp_path / "o2", PrepareConfig(strict=True), progress=False)
    (d / "one.txt").write_text("Only one document.\nWith two sentences.\n")
    with pytest.raises(BertkitError, match="at least 2 documents"):
        prepare([str(d / "one.txt")], tok, tmp_path / "o3", PrepareConfig(), progress=False)
    prepare([str(d / "one.txt")], tok, tmp_path / "o3", PrepareConfig(nsp=False), progress=False)
    vocab = dict(tok.vocab)
    vocab["zzzextra"] = len(vocab)
    with pytest.raises(BertkitError, match="another tokenizer"):
        prepare([str(d / "one.txt")], Tokenizer(vocab), tmp_path / "o3", PrepareConfig(nsp=False), progress=False)
    with pytest.raises(BertkitError, match="no such file"):
        prepare([str(d / "missing.txt")], tok, tmp_path / "o4", PrepareConfig(), progress=False)
    with pytest.raises(BertkitError, match="no text"):
        prepare([str(d / "empty.txt")], tok, tmp_path / "o5", PrepareConfig(nsp=False), progress=False)


def test_prepare_sentence_split(tok, tmp_path):
    (tmp_path / "p.txt").write_text("Mr. Smith came. He left! Then? Yes.\nSecond para. Two.\n\nOther doc. Here.\n")
    meta = prepare([str(tmp_path / "p.txt")], tok, tmp_path / "o", PrepareConfig(sentence_split=True, max_length=16),
                   progress=False)
    assert (meta["counts"]["sentences"], meta["counts"]["documents"]) == (8, 2)
    assert meta["config"]["sentence_split"] is True
