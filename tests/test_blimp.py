"""BLiMP scoring: the pseudo-log-likelihood and the causal log-likelihood equal an independent computation
(transformers on the folder bertkit saved) to 1e-4 per sentence; ties fail; the interval; the command."""
from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest
import torch

from bertkit import blimp
from bertkit.checkpoint import build, save_model
from bertkit.cli import main
from bertkit.config import BertConfig
from bertkit.infer import Predictor

transformers = pytest.importorskip("transformers")

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "?", ",", "the", "a", "cat", "cats", "dog", "dogs",
         "is", "are", "was", "were", "on", "mat", "who", "what", "saw", "he", "she", "himself", "herself",
         "walk", "run", "jump", "un", "##s", "##ed", "##ning", "##ing", "##happ", "##ily", "##y", "##le"]
SENTENCES = ["The cat was on the mat.", "The cats walked.", "Who saw the dogs?", "He saw himself running.",
             "She jumped unhappily.", "A dog is unhappy, the cats are running.", "Dogs run.", "walked"]


def _save(path, causal: bool = False, constant: bool = False, head: str = "masked_lm", **arch):
    """A small post-LN bertkit model (absolute positions, as transformers computes it; `arch` changes
    that) with weights large enough that the log-probabilities differ, saved with its vocabulary."""
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=48,
                     max_position_embeddings=40, initializer_range=0.3, causal=causal, **arch)
    model = build(head, cfg).eval()
    if constant:               # every position predicts the uniform distribution: every token log(1/V)
        with torch.no_grad():
            model.mlm.norm.weight.zero_()
            model.mlm.norm.bias.zero_()
            model.mlm.bias.zero_()
    save_model(model, path)
    (path / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("mlm"))


@pytest.fixture(scope="module")
def clm_dir(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("clm"), causal=True)


def _hf_tokens(path, text):
    tok = transformers.BertTokenizerFast.from_pretrained(path)      # reads vocab.txt
    enc = tok(text)
    return enc["input_ids"], enc.word_ids()


def _hf_pll(hf, ids, words, word_l2r: bool) -> float:
    """Salazar et al.'s PLL written out: one forward per masked copy, float64 sums."""
    total = 0.0
    for i in range(1, len(ids) - 1):
        x = torch.tensor(ids)
        hide = [j for j in range(i, len(ids) - 1) if j == i or (word_l2r and words[j] == words[i])]
        x[hide] = VOCAB.index("[MASK]")
        with torch.no_grad():
            logits = hf(input_ids=x[None]).logits[0, i].double()
        total += float(logits.log_softmax(-1)[ids[i]])
    return total


@pytest.mark.parametrize("method", ["pll", "pll-word-l2r"])
def test_pll_equals_transformers(mlm_dir, method, one_thread):
    hf = transformers.BertForMaskedLM.from_pretrained(mlm_dir).eval()
    pred = blimp.load(mlm_dir)
    ours, pieces, read = blimp.score_sentences(pred, SENTENCES, method, max_tokens=64)   # many batches
    again, _, _ = blimp.score_sentences(pred, SENTENCES, method, max_tokens=64, workers=3)
    assert np.array_equal(ours, again)                     # batches on 3 threads of one core each
    split = 0
    for text, got, n in zip(SENTENCES, ours, pieces):
        ids, words = _hf_tokens(mlm_dir, text)
        assert ids == pred.tokenizer.encode(text).input_ids and n == len(ids) - 2
        split += len(words) - len(set(words))
        assert abs(got - _hf_pll(hf, ids, words, method == "pll-word-l2r")) < 1e-4, text
    assert split >= 5                       # the sentences do hold words of several pieces
    assert read == sum((n + 2) * n for n in pieces)


@pytest.mark.parametrize("arch", [{}, {"norm_position": "pre", "position_embedding_type": "alibi"}],
                         ids=["post-ln", "pre-ln-alibi"])
def test_last_block_at_the_scored_position_equals_the_full_forward(tmp_path, arch, one_thread):
    """load() runs the last block at the masked position only; a prepacked Predictor runs every block in
    full (the shortcut is off): the same scores, also for the CPU recipe's pre-LN + ALiBi model."""
    d = _save(tmp_path / "m", **arch)
    fast = blimp.load(d)
    full = Predictor.from_dir(d, head="masked_lm", precision="fp32", small_batches=False, prepack=True)
    assert blimp._plain(fast.encoder) and not blimp._plain(full.encoder)
    for method in ("pll", "pll-word-l2r"):
        a, _, _ = blimp.score_sentences(fast, SENTENCES, method, max_tokens=100)
        b, _, _ = blimp.score_sentences(full, SENTENCES, method)
        assert np.abs(a - b).max() < 1e-4, method


def test_word_l2r_masks_the_later_pieces_of_the_word():
    # [CLS] un ##happ ##ily cats [SEP]: words 0 0 0 1
    ids = torch.tensor([[2, 30, 35, 36, 11, 3]])
    words = torch.tensor([[-1, 0, 0, 0, 1, -1]])
    rows, at, targets, owner = blimp.copies(ids, words, "pll-word-l2r", mask_id=4)
    assert rows.tolist() == [[2, 4, 4, 4, 11, 3], [2, 30, 4, 4, 11, 3], [2, 30, 35, 4, 11, 3], [2, 30, 35, 36, 4, 3]]
    assert at.tolist() == [1, 8, 15, 22] and targets.tolist() == [30, 35, 36, 11] and owner.tolist() == [0] * 4
    plain, *_ = blimp.copies(ids, words, "pll", mask_id=4)
    assert (plain == 4).sum(1).tolist() == [1, 1, 1, 1]


def test_causal_equals_transformers(clm_dir, one_thread):
    # transformers' BertLMHeadModel under is_decoder runs the same weights left to right; the head at
    # position i - 1 predicts token i (bertkit's clm pre-training)
    assert json.loads((clm_dir / "config.json").read_text())["bertkit_causal"] is True
    hf = transformers.BertLMHeadModel.from_pretrained(clm_dir, is_decoder=True).eval()
    pred = blimp.load(clm_dir)
    assert blimp.method_for(pred) == "causal"
    ours, pieces, _ = blimp.score_sentences(pred, SENTENCES, "causal", max_tokens=32)
    for text, got in zip(SENTENCES, ours):
        ids, _ = _hf_tokens(clm_dir, text)
        with torch.no_grad():
            logp = hf(input_ids=torch.tensor([ids])).logits[0].double().log_softmax(-1)     # (T, V)
        want = sum(float(logp[i - 1, ids[i]]) for i in range(1, len(ids) - 1))
        assert abs(got - want) < 1e-4, text
    # the same sums by hand with torch: a bidirectional copy of the weights never sees the right context
    # under a lower-triangular mask
    model = pred.model
    for text, got in zip(SENTENCES[:3], ours):
        ids = pred.tokenizer.encode(text).input_ids
        with torch.no_grad():
            h = model.bert(torch.tensor([ids]))[0]
            logp = model.mlm(h).double().log_softmax(-1)
        assert abs(got - sum(float(logp[i - 1, ids[i]]) for i in range(1, len(ids) - 1))) < 1e-4


def test_a_pretraining_checkpoint_folder_is_read_from_its_model_folder(tmp_path, mlm_dir):
    import shutil

    shutil.copytree(mlm_dir, tmp_path / "step-00000008" / "model")
    assert blimp.load(tmp_path / "step-00000008").config.vocab_size == len(VOCAB)


def test_a_method_the_model_cannot_run_is_refused(mlm_dir, clm_dir):
    mlm, clm = blimp.load(mlm_dir), blimp.load(clm_dir)
    assert blimp.method_for(mlm) == "pll" and blimp.method_for(mlm, "pll-word-l2r") == "pll-word-l2r"
    with pytest.raises(blimp.DataError, match="attends both ways"):
        blimp.method_for(mlm, "causal")
    with pytest.raises(blimp.DataError, match="causal"):
        blimp.method_for(clm, "pll")


def _pairs(n_per: int = 3) -> list[dict]:
    """Pairs of two real paradigms (so the published figures line up), good and bad of equal length."""
    rows = []
    for uid, term in (("anaphor_gender_agreement", "anaphor_agreement"), ("regular_plural_subject_verb_agreement_1",
                                                                         "subject_verb_agreement")):
        for i in range(n_per):
            good, bad = ("He saw himself.", "He saw herself.") if i % 2 == 0 else ("The cats are on the mat.",
                                                                                  "The cats is on the mat.")
            rows.append({"UID": uid, "field": "syntax", "linguistics_term": term, "pairID": str(i),
                         "sentence_good": good, "sentence_bad": bad})
    return rows


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_a_model_that_scores_every_sentence_the_same_gets_zero(tmp_path, one_thread):
    d = _save(tmp_path / "constant", constant=True)
    pred = blimp.load(d)
    pairs = blimp.read_pairs([_write_jsonl(tmp_path / "p.jsonl", _pairs())])
    scored = blimp.score_pairs(pred, pairs, "pll")
    assert np.allclose(scored["good"], -scored["good_tokens"] * math.log(len(VOCAB)))
    s = blimp.summarize(pairs, scored["good"], scored["bad"])
    assert s["overall"]["accuracy"] == 0.0 and s["overall"]["ties"] == len(pairs)
    assert s["overall"]["ci95"][0] == 0.0
    # and a NaN never counts as a success either
    s = blimp.summarize(pairs, np.full(len(pairs), np.nan), np.zeros(len(pairs)))
    assert s["overall"]["correct"] == 0


def test_wilson_interval():
    stats = pytest.importorskip("scipy.stats")
    for k, n in ((8, 10), (0, 10), (10, 10), (412, 500), (20_500, 33_500)):
        ci = stats.binomtest(k, n).proportion_ci(0.95, method="wilson")
        lo, hi = blimp.wilson(k, n)
        assert abs(lo - ci.low) < 1e-6 and abs(hi - ci.high) < 1e-6, (k, n)
    assert blimp.wilson(0, 0) == (0.0, 1.0)
    lo, hi = blimp.wilson(20_500, 33_500)
    assert 0.004 < (hi - lo) / 2 < 0.006               # the data README's "about +-0.5 points"


def test_summary_per_phenomenon_and_paradigm_beside_the_paper():
    rows = _pairs(4)
    pairs = [blimp.Pair(r["UID"], r["linguistics_term"], r["pairID"], r["sentence_good"], r["sentence_bad"], "x")
             for r in rows]
    good = np.array([1.0, 0, 1, 1, 1, 1, 1, 1])
    s = blimp.summarize(pairs, good, np.zeros(8), blimp.published())
    assert s["overall"]["correct"] == 7 and s["overall"]["ties"] == 1
    assert s["paradigms"]["anaphor_gender_agreement"]["accuracy"] == 0.75
    assert s["paradigms"]["anaphor_gender_agreement"]["published"]["gpt2"] == 0.994
    assert s["phenomena"]["subject_verb_agreement"]["accuracy"] == 1.0
    pub = blimp.published()
    assert len(pub) == 67
    want = (pub["anaphor_gender_agreement"]["ngram"] + pub["regular_plural_subject_verb_agreement_1"]["ngram"]) / 2
    assert s["published"]["ngram"] == pytest.approx(want)


def test_reading_pairs(tmp_path):
    folder = tmp_path / "blimp"
    folder.mkdir()
    rows = _pairs(3)
    _write_jsonl(folder / "a.jsonl", rows[:3])
    with gzip.open(folder / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows[3:]))
    _write_jsonl(folder / "published_lm_results.jsonl", [{"UID": "x", "ngram": 0.5}])   # skipped in a folder
    assert len(blimp.read_pairs([folder])) == 6
    assert [p.pair_id for p in blimp.read_pairs([folder], limit=2)] == ["0", "1", "0", "1"]
    with pytest.raises(blimp.DataError, match="already read"):
        blimp.read_pairs([folder, folder / "a.jsonl"])
    bad = _write_jsonl(tmp_path / "bad.jsonl", [rows[0], {**rows[1], "sentence_bad": 3}])
    with pytest.raises(blimp.DataError, match=r"bad.jsonl:2: field 'sentence_bad'"):
        blimp.read_pairs([bad])
    with pytest.raises(blimp.DataError, match="no such file"):
        blimp.read_pairs([tmp_path / "missing.jsonl"])


def test_command_end_to_end(tmp_path, mlm_dir, capsys, one_thread):
    data = _write_jsonl(tmp_path / "pairs.jsonl", _pairs(3))
    out = tmp_path / "res"
    assert main(["blimp", "--model", str(mlm_dir), str(data), "--out", str(out), "--limit", "2"]) == 0
    text = capsys.readouterr().out
    assert "accuracy" in text and "anaphor_gender_agreement" in text and "GPT-2" in text
    res = json.loads((out / "results.json").read_text())
    assert res["method"] == "pll" and res["overall"]["pairs"] == 4 and len(res["paradigms"]) == 2
    assert res["run"]["precision"] == "float32" and res["run"]["tokens_read"] > 0
    lines = [json.loads(x) for x in (out / "pairs.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and sum(x["correct"] for x in lines) == res["overall"]["correct"]
    # the same scores as the library computes, and a .json --out with --json on stdout
    pred = blimp.load(mlm_dir)
    want, _, _ = blimp.score_sentences(pred, ["He saw himself."], "pll")
    assert abs(lines[0]["good"] - want[0]) < 1e-9
    assert main(["blimp", "--model", str(mlm_dir), str(data), "--out", str(tmp_path / "r.json"), "--json",
                 "--method", "pll-word-l2r"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["method"] == "pll-word-l2r" and (tmp_path / "r.pairs.jsonl").is_file()


def test_command_errors_are_one_line(tmp_path, mlm_dir, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_pairs(1)[0]) + "\n{not json\n", encoding="utf-8")
    assert main(["blimp", "--model", str(mlm_dir), str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert "bad.jsonl:2: not valid JSON" in err and "\n" not in err
    good = _write_jsonl(tmp_path / "ok.jsonl", _pairs(1))
    assert main(["blimp", "--model", str(mlm_dir), str(good), "--method", "causal"]) == 1
    assert "attends both ways" in capsys.readouterr().err
    enc = tmp_path / "encoder"
    _save(enc, head="encoder")
    assert main(["blimp", "--model", str(enc), str(good)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("bertkit blimp: error:") and "\n" not in err
    assert main(["blimp", "--model", str(mlm_dir), str(good), "--limit", "0"]) == 1
    assert capsys.readouterr().err == "bertkit blimp: error: limit must be at least 1, got 0\n"   # BlimpOptions' rule
    assert main(["blimp", "--model", str(mlm_dir), str(good), "--max-tokens", "8"]) == 1
    assert "max_tokens must be at least 16" in capsys.readouterr().err


def test_the_dev_file_and_the_bundled_sample(shared_data):
    pairs = blimp.read_pairs([shared_data / "blimp" / "blimp_dev.jsonl.gz"])
    assert len(pairs) == 33_500 and len({p.paradigm for p in pairs}) == 67
    assert {p.paradigm for p in pairs} == set(blimp.published())
    sample = blimp.read_pairs([blimp.SAMPLE])
    assert len(sample) == 134 and {p.paradigm for p in sample} == set(blimp.published())
