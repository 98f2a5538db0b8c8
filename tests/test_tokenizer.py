"""Tokenizer ids equal Hugging Face's BertTokenizer (Rust) and the original pure-Python rules."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from bertkit.tokenizer import Tokenizer, TokenizerError, longest_first

transformers = pytest.importorskip("transformers")
HARD = [json.loads(line) for line in (Path(__file__).parent / "data" / "tokenizer_hard_cases.jsonl")
        .read_text(encoding="utf-8").split("\n") if line]


def _legacy_class():
    return getattr(transformers, "BertTokenizerLegacy", None)


def _cased_dir(tmp_path, minilm):
    """A cased tokenizer folder: the real vocab plus a few cased entries, do_lower_case false."""
    vocab = (minilm / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    vocab += ["Hello", "Paris", "France", "Zoë", "##É", "Crème"]
    d = tmp_path / "cased"
    d.mkdir()
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (d / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False, "tokenizer_class": "BertTokenizer"}))
    return d


@pytest.mark.parametrize("cased", [False, True])
def test_ids_equal_transformers_on_hard_cases(minilm, tmp_path, cased):
    folder = _cased_dir(tmp_path, minilm) if cased else minilm
    ours = Tokenizer.from_dir(folder)
    assert ours.lowercase is (not cased)
    refs = [transformers.BertTokenizer.from_pretrained(folder)]
    if _legacy_class() is not None:
        refs.append(_legacy_class().from_pretrained(folder))
    for case in HARD:
        text, pair = case["text"], case.get("text_pair")
        enc = ours.encode(text, pair)
        for ref in refs:
            r = ref(text, pair, return_token_type_ids=True) if pair is not None else ref(text, return_token_type_ids=True)
            assert enc.input_ids == r["input_ids"], (type(ref).__name__, text)
            assert enc.token_type_ids == r["token_type_ids"], (type(ref).__name__, text)


@pytest.mark.parametrize("max_length", [8, 16, 33])
def test_truncation_equals_transformers_and_is_counted(minilm, max_length, caplog):
    ours = Tokenizer.from_dir(minilm)
    ref = transformers.BertTokenizer.from_pretrained(minilm)
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        for case in HARD:
            text, pair = case["text"], case.get("text_pair")
            enc = ours.encode(text, pair, max_length=max_length)
            kw = dict(truncation="longest_first", max_length=max_length)
            r = ref(text, pair, **kw) if pair is not None else ref(text, **kw)
            assert enc.input_ids == r["input_ids"], text
            full = ours.encode(text, pair)
            assert enc.truncated == len(full) - len(enc)
    assert ours.stats.truncated_inputs > 0 and ours.stats.tokens_cut > 0
    assert sum("truncating" in r.message for r in caplog.records) == 1      # warned once


def test_longest_first_rule():
    assert longest_first(10, 2, 8) == (6, 2)
    assert longest_first(2, 10, 8) == (2, 6)
    assert longest_first(10, 10, 8) == (4, 4)
    assert longest_first(10, 10, 7) == (3, 4)          # HF: on a tie A keeps budget // 2
    assert longest_first(7, 12, 5) == (2, 3)
    assert longest_first(5, 0, 3) == (3, 0)
    assert longest_first(3, 3, 10) == (3, 3)


def test_offsets_special_mask_and_words(minilm):
    tok = Tokenizer.from_dir(minilm)
    text = "Crème brûlée, naïve!"
    enc = tok.encode(text, "second part")
    ref = transformers.BertTokenizer.from_pretrained(minilm)(text, "second part", return_offsets_mapping=True,
                                                                return_special_tokens_mask=True)
    assert enc.offsets == [tuple(o) for o in ref["offset_mapping"]]
    assert enc.special_tokens_mask == ref["special_tokens_mask"]
    assert enc.tokens[0] == "[CLS]" and enc.tokens.count("[SEP]") == 2
    word0 = [i for i, w in enumerate(enc.word_ids) if w == 0 and enc.sequence_ids[i] == 0]
    assert text[enc.offsets[word0[0]][0]:enc.offsets[word0[-1]][1]] == "Crème"     # offsets index the raw text
    assert enc.word_ids[0] is None and enc.word_ids[1] == 0


def test_words_encoding_for_ner(minilm):
    from bertkit.tasks.ner import TaggedExample, featurize_tokens

    words = ["EU", "rejects", "German", "call"]
    feat, = featurize_tokens([TaggedExample("0", words)], Tokenizer.from_dir(minilm), None, max_length=32)
    ref = transformers.BertTokenizer.from_pretrained(minilm)(words, is_split_into_words=True)
    assert feat["input_ids"] == ref["input_ids"]
    ref_words = ref.word_ids()
    assert feat["word_ids"] == [w if w is not None and (j == 0 or ref_words[j - 1] != w) else None
                                for j, w in enumerate(ref_words)]            # each word's first piece


def test_tokenizer_json_only_folder_and_save_round_trip(minilm, tmp_path):
    only_json = tmp_path / "json"
    only_json.mkdir()
    (only_json / "tokenizer.json").write_bytes((minilm / "tokenizer.json").read_bytes())
    a, b = Tokenizer.from_dir(minilm), Tokenizer.from_dir(only_json)
    assert a.vocab == b.vocab and a.fingerprint() == b.fingerprint()
    saved = tmp_path / "saved"
    a.save(saved)
    c = Tokenizer.from_dir(saved)
    assert c.fingerprint() == a.fingerprint()
    ref = transformers.BertTokenizer.from_pretrained(saved)
    for case in HARD[:10]:
        assert c.encode(case["text"]).input_ids == ref(case["text"])["input_ids"]
    # the saved tokenizer.json has no stray padding/truncation: long texts come back whole
    long = "word " * 300
    assert len(c.encode(long)) == 302


def test_pad_and_call(minilm):
    tok = Tokenizer.from_dir(minilm)
    batch = tok(["a b c", "a"], ["d", "e f"])
    assert batch["input_ids"].shape == (2, 7)
    assert batch["attention_mask"].tolist() == [[1] * 7, [1, 1, 1, 1, 1, 1, 0]]
    assert batch["token_type_ids"][1].tolist() == [0, 0, 0, 1, 1, 1, 0]


def test_bad_tokenizer_folders(tmp_path):
    with pytest.raises(TokenizerError, match="not a directory"):
        Tokenizer.from_dir(tmp_path / "missing")
    with pytest.raises(TokenizerError, match="no vocab.txt or tokenizer.json"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "vocab.txt").write_text("a\nb\n")
    with pytest.raises(TokenizerError, match="missing special tokens"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "vocab.txt").write_bytes(b"\xff\xfe[PAD]\n")
    with pytest.raises(TokenizerError, match="not valid UTF-8"):
        Tokenizer.from_dir(tmp_path)


def test_train_small_vocab(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat\nthe dog sat on the log\n" * 50, encoding="utf-8")
    tok = Tokenizer.train([corpus], vocab_size=60, min_frequency=1)
    assert all(t in tok.vocab for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"))
    tok.save(tmp_path / "tok")
    ref = transformers.BertTokenizer.from_pretrained(tmp_path / "tok")
    assert Tokenizer.from_dir(tmp_path / "tok").encode("the cat sat").input_ids == ref("the cat sat")["input_ids"]


# ---- training is deterministic ---------------------------------------------------------------------
def test_training_gives_byte_identical_files_run_after_run(tmp_path):
    """Three `bertkit tokenizer train` processes (each with its own hash seed) on the bundled sample:
    the same bytes in every file. (The `tokenizers` trainer breaks ties in hash-map order: its
    vocabularies differ from run to run, ids and tokens.)"""
    import gzip
    import os
    import subprocess
    import sys
    from importlib import resources

    sample = tmp_path / "inaugural.txt"
    sample.write_bytes(gzip.decompress((resources.files("bertkit") / "sample" / "inaugural.txt.gz").read_bytes()))
    outs = []
    for seed in ("0", "1", "random"):
        out = tmp_path / f"tok{seed}"
        env = {**os.environ, "PYTHONHASHSEED": seed, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run([sys.executable, "-m", "bertkit", "tokenizer", "train", str(sample), "--vocab-size",
                               "3000", "--out", str(out)], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(out)
    names = sorted(p.name for p in outs[0].iterdir())
    assert names == ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"]
    for out in outs[1:]:
        for name in names:
            assert (out / name).read_bytes() == (outs[0] / name).read_bytes(), name
    assert len((outs[0] / "vocab.txt").read_text(encoding="utf-8").splitlines()) == 3000


def _reference_wordpiece(word_counts: dict, vocab_size: int, min_frequency: int, limit_alphabet: int) -> list[str]:
    """The same rules as `learn_wordpiece`, the slow obvious way: recount every pair after each merge."""
    from bertkit.tokenizer import SPECIAL_TOKENS

    chars: dict[str, int] = {}
    for w, n in word_counts.items():
        for ch in w:
            chars[ch] = chars.get(ch, 0) + n
    alphabet = {ch for ch, _ in sorted(chars.items(), key=lambda kv: (-kv[1], kv[0]))[:limit_alphabet]}
    tokens = [*SPECIAL_TOKENS, *sorted(alphabet)]
    kept = {w: n for w, n in word_counts.items() if set(w) <= alphabet}
    tokens += ["##" + ch for ch in sorted({ch for w in kept for ch in w[1:]})]
    words = {w: [tokens.index(w[0])] + [tokens.index("##" + ch) for ch in w[1:]] for w in kept}
    while len(tokens) < vocab_size:
        counts: dict = {}
        for w, ids in words.items():
            for p in zip(ids, ids[1:]):
                counts[p] = counts.get(p, 0) + kept[w]
        if not counts:
            break
        (a, b), c = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        if c < min_frequency:
            break
        new = tokens[a] + tokens[b][2:]
        if new not in tokens:
            tokens.append(new)
        nid = tokens.index(new)
        for w, ids in words.items():
            out, i = [], 0
            while i < len(ids):
                if i + 1 < len(ids) and (ids[i], ids[i + 1]) == (a, b):
                    out.append(nid)
                    i += 2
                else:
                    out.append(ids[i])
                    i += 1
            words[w] = out
    return tokens


@pytest.mark.parametrize("seed", range(6))
def test_learner_equals_the_obvious_algorithm(seed):
    """Incremental pair counts give the merges that recounting everything gives: runs of one letter
    ('aaaa'), repeats ('abab'), merges that make an existing token, ties, an alphabet limit."""
    import random

    from bertkit.tokenizer import SPECIAL_TOKENS
    from bertkit.wordpiece import learn_wordpiece

    rng = random.Random(seed)
    letters = "aab" if seed % 2 else "abcdeé"
    counts = {"".join(rng.choice(letters) for _ in range(rng.randint(1, 7))): rng.randint(1, 5) for _ in range(60)}
    for vocab_size, min_frequency, limit in ((40, 1, 100), (80, 2, 4), (200, 1, 3)):
        assert learn_wordpiece(counts, vocab_size, min_frequency, limit, special_tokens=SPECIAL_TOKENS) == \
            _reference_wordpiece(counts, vocab_size, min_frequency, limit), (vocab_size, min_frequency, limit)


def test_word_counts_equal_the_normalizer_and_pre_tokenizer(tmp_path):
    """The fast ASCII path and the regular-expression split give the words `tokenizers` gives."""
    import random
    from collections import Counter

    from tokenizers import normalizers, pre_tokenizers

    from bertkit.wordpiece import count_words

    rng = random.Random(0)
    lines = [c["text"] + " " + (c.get("text_pair") or "") for c in HARD]
    lines += ["".join(chr(rng.randrange(0, 128)) for _ in range(80)) for _ in range(100)]       # control chars
    lines += ["".join(chr(rng.randrange(0, 0x3100)) for _ in range(80)) for _ in range(100)]    # accents, CJK
    lines = [line.replace("\n", " ").replace("\r", " ") for line in lines]
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    for lowercase in (True, False):
        norm = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=None)
        pre = pre_tokenizers.BertPreTokenizer()
        expected = Counter(w for line in corpus.read_text(encoding="utf-8").split("\n") if line.strip()
                           for w, _ in pre.pre_tokenize_str(norm.normalize_str(line)))
        assert count_words([corpus], lowercase) == expected


# ---- `tokenizer train` into an existing folder: old or new, never a mix ------------------------------
_KILLER = """
import os, signal, sys
from pathlib import Path
import bertkit.tokenizer as T
when, save = os.environ["KILL_WHEN"], T.Tokenizer.save
def killing_save(self, path):
    if when == "after-vocab":      # the new vocab.txt is written, tokenizer.json not yet
        ordered = sorted(self.vocab.items(), key=lambda kv: kv[1])
        Path(path, "vocab.txt").write_text("".join(t + "\\n" for t, _ in ordered), encoding="utf-8")
        os.kill(os.getpid(), signal.SIGKILL)
    save(self, path)
    if when == "after-save":       # every file written, not yet in place
        os.kill(os.getpid(), signal.SIGKILL)
T.Tokenizer.save = killing_save
from bertkit.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _train_cmd(corpus: Path, out: Path, vocab_size: int) -> list[str]:
    return ["tokenizer", "train", str(corpus), "--vocab-size", str(vocab_size), "--out", str(out)]


def _folder(out: Path) -> dict[str, bytes]:
    """The files of a tokenizer folder, after checking they belong together."""
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(files) == ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"]
    vocab = json.loads(files["tokenizer.json"])["model"]["vocab"]
    assert files["vocab.txt"].decode("utf-8").split("\n")[:-1] == sorted(vocab, key=vocab.get)
    return files


@pytest.fixture(scope="module")
def two_tokenizers(tmp_path_factory):
    """A corpus, and the folders `tokenizer train` makes of it at vocab 1500 ('old') and 2500 ('new')."""
    import gzip
    from importlib import resources

    from bertkit.cli import main

    root = tmp_path_factory.mktemp("tok_atomic")
    corpus = root / "corpus.txt"
    corpus.write_bytes(gzip.decompress((resources.files("bertkit") / "sample" / "inaugural.txt.gz").read_bytes()))
    for name, size in (("old", 1500), ("new", 2500)):
        assert main(_train_cmd(corpus, root / name, size)) == 0
    return corpus, _folder(root / "old"), _folder(root / "new"), root


@pytest.mark.parametrize("when", ["after-vocab", "after-save"])
def test_a_killed_rerun_leaves_the_previous_tokenizer_whole(two_tokenizers, tmp_path, when):
    import os
    import shutil
    import subprocess
    import sys

    corpus, old, new, root = two_tokenizers
    out = tmp_path / "tok"
    shutil.copytree(root / "old", out)
    env = {**os.environ, "KILL_WHEN": when, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", _KILLER, *_train_cmd(corpus, out, 2500)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert _folder(out) == old                                  # untouched: no new vocab.txt beside old files
    assert (tmp_path / "tok.incomplete").is_dir()               # the unfinished one, visibly so
    from bertkit.cli import main
    assert main(_train_cmd(corpus, out, 2500)) == 0             # a rerun clears it and finishes
    assert _folder(out) == new
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok"]


def test_kill_9_at_random_moments_never_mixes_two_tokenizers(two_tokenizers, tmp_path):
    import os
    import random
    import shutil
    import signal
    import subprocess
    import sys
    import time

    corpus, old, new, root = two_tokenizers
    out = tmp_path / "tok"
    rng = random.Random(0)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def start(i: int) -> subprocess.Popen:
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(root / ("old" if i % 2 else "new"), out)
        return subprocess.Popen([sys.executable, "-m", "bertkit", *_train_cmd(corpus, out, 2500 if i % 2 else 1500)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    t0 = time.monotonic()
    assert start(1).wait(timeout=300) == 0                 # how long a whole run takes here
    full = time.monotonic() - t0
    assert _folder(out) == new
    outcomes = []
    for i in range(8):
        proc = start(i)
        before = _folder(out)
        time.sleep(rng.uniform(0.1, 1.0) * full)           # anywhere in the run, the swap included
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        after = _folder(out)
        assert after in (old, new)
        outcomes.append("kept" if after == before else "replaced")
    assert "kept" in outcomes, outcomes     # the kills did land mid-run (and a finished run is fine too)


def test_train_refuses_an_out_that_is_not_a_tokenizer_folder(two_tokenizers, tmp_path, capsys):
    from bertkit.cli import main

    corpus = two_tokenizers[0]
    (tmp_path / "a_file").write_text("x")
    assert main(_train_cmd(corpus, tmp_path / "a_file", 1500)) == 1
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "notes.txt").write_text("mine")
    assert main(_train_cmd(corpus, tmp_path / "mixed", 1500)) == 1
    assert (tmp_path / "mixed" / "notes.txt").read_text() == "mine"
    assert main(_train_cmd(tmp_path / "missing.txt", tmp_path / "fresh", 1500)) == 1
    err = capsys.readouterr().err
    assert err.count("bertkit tokenizer: error:") == 3 and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "mixed"]   # nothing left behind


@pytest.mark.parametrize("seed", range(4))
def test_long_texts_are_read_in_pieces_with_the_same_result(monkeypatch, small_vocab_dir, seed):
    """With max_length, a text over LONG_TEXT_CHARS is tokenized piece by piece (cut between words,
    never inside [MASK]): kept tokens, offsets, word ids, truncation counts as the whole text gives."""
    import random

    import bertkit.tokenizer as T

    tok = Tokenizer.from_dir(small_vocab_dir)
    rng = random.Random(seed)
    parts = ["hello", "world", "[MASK]", "[SEP]", "Crème", "brûlée", "東京", "。", "don't", "e.g.", "x" * 150,
             "\u0301", "\t", "  ", "ab,cd", "[", "]", "[MA", "SK]", "Ω", "the", "of"]
    text = "".join(rng.choice(parts) + rng.choice([" ", "", " "]) for _ in range(20000))
    pair = "".join(rng.choice(parts) + " " for _ in range(3000))
    for texts, pairs, max_length in (([text], None, 64), ([text, "short one"], [pair, pair], 128),
                                     ([pair], [text], 33)):
        monkeypatch.setattr(T, "LONG_TEXT_CHARS", 10 ** 9)
        whole = tok.encode_batch(texts, pairs, max_length)
        monkeypatch.setattr(T, "LONG_TEXT_CHARS", 500)
        pieces = tok.encode_batch(texts, pairs, max_length)
        assert pieces == whole
        assert whole[0].truncated > 1000
