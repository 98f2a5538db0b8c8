"""MLM masking: counts as Google, never specials, 80/10/10, whole words, spans, determinism."""
from __future__ import annotations

import numpy as np
import pytest

from bertkit.data.masking import Collator, MaskingConfig, MaskingError, TokenInfo, mask_sequence, num_to_predict

V, PAD, CLS, SEP, MASK = 1000, 0, 101, 102, 103
SPECIAL = (PAD, CLS, SEP, MASK)


def seq(n_a=60, n_b=60, pad=8, seed=0):
    r = np.random.default_rng(seed)
    return np.concatenate([[CLS], r.integers(200, V, n_a), [SEP], r.integers(200, V, n_b), [SEP], [PAD] * pad])


def test_num_to_predict_matches_google_formula():
    cfg = MaskingConfig()
    assert num_to_predict(125, cfg) == 19          # round(18.75)
    assert num_to_predict(3, cfg) == 1             # max(1, ...)
    assert num_to_predict(500, cfg) == 20          # capped
    assert num_to_predict(0, cfg) == 0
    assert num_to_predict(10, MaskingConfig(mask_prob=0.25)) == 2   # round(2.5) = 2 (Python 3)


def test_token_masking_counts_specials_and_labels():
    cfg = MaskingConfig()
    x = seq()
    for s in range(50):
        masked, labels = mask_sequence(x, cfg, np.random.default_rng(s), V, MASK, SPECIAL)
        sel = labels != -100
        assert sel.sum() == 18                      # round(120 * 0.15) = 18
        assert not np.isin(x[sel], SPECIAL).any()   # never [CLS]/[SEP]/[PAD]
        assert (labels[sel] == x[sel]).all()
        assert (masked[~sel] == x[~sel]).all()


def test_replacement_fractions():
    cfg = MaskingConfig(max_predictions=1000)
    x = seq(300, 300, pad=0)
    n_mask = n_keep = n_rand = 0
    for s in range(300):
        masked, labels = mask_sequence(x, cfg, np.random.default_rng(s), V, MASK, SPECIAL)
        sel = labels != -100
        n_mask += (masked[sel] == MASK).sum()
        n_keep += (masked[sel] == x[sel]).sum()
        n_rand += ((masked[sel] != MASK) & (masked[sel] != x[sel])).sum()
    tot = n_mask + n_keep + n_rand
    assert abs(n_mask / tot - 0.8) < 0.01
    assert abs(n_rand / tot - 0.1) < 0.01           # (a random draw equal to the original counts as keep)
    cfg = MaskingConfig(mask_token_fraction=0.5, random_token_fraction=0.5, max_predictions=1000)
    masked, labels = mask_sequence(x, cfg, np.random.default_rng(0), V, MASK, SPECIAL)
    sel = labels != -100
    assert 0.3 < (masked[sel] == MASK).mean() < 0.7


def test_whole_word_groups_pieces():
    # words: ids >= 500 are '##' pieces
    r = np.random.default_rng(1)
    body = r.integers(200, V, 200)
    x = np.concatenate([[CLS], body, [SEP]])
    sub = x >= 500
    sub[0] = sub[-1] = False
    cfg = MaskingConfig(mode="whole_word", max_predictions=1000)
    for s in range(20):
        masked, labels = mask_sequence(x, cfg, np.random.default_rng(s), V, MASK, SPECIAL, is_subword=sub)
        sel = labels != -100
        assert 0 < sel.sum() <= num_to_predict(200, cfg)
        # a selected piece's whole word is selected: the word start before it and pieces after it
        for i in np.flatnonzero(sel):
            if sub[i] and i > 1:                  # (a piece right after [CLS] starts a word)
                assert sel[i - 1]
            if i + 1 < len(x) - 1 and sub[i + 1]:
                assert sel[i + 1]
        # replacement per word: all pieces of a word share [MASK]-or-not
        starts = np.flatnonzero(~sub[1:-1] | (np.arange(1, len(x) - 1) == 1)) + 1
        for a, b in zip(starts, list(starts[1:]) + [len(x) - 1]):
            if sel[a]:
                m = masked[a:b] == MASK
                assert m.all() or not m.any()


def test_span_masking_budget_and_contiguity():
    x = seq(200, 0, pad=0)[:-1]
    cfg = MaskingConfig(mode="span", max_predictions=1000)
    lens = []
    for s in range(30):
        masked, labels = mask_sequence(x, cfg, np.random.default_rng(s), V, MASK, SPECIAL)
        sel = labels != -100
        assert sel.sum() == num_to_predict(200, cfg)
        assert not sel[0]
        runs = np.diff(np.flatnonzero(np.diff(np.r_[0, sel.astype(int), 0])))[::2]
        lens.extend(runs)
    assert np.mean(lens) > 1.5                     # spans, not single tokens


def test_config_rejects_bad_values():
    with pytest.raises(MaskingError):
        MaskingConfig(mode="words")
    with pytest.raises(MaskingError):
        MaskingConfig(mask_token_fraction=0.9, random_token_fraction=0.2)


def test_collator_dynamic_is_pure_function_of_seed_epoch_index():
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": CLS, "[SEP]": SEP, "[MASK]": MASK}
    vocab.update({f"w{i}": i for i in range(200, V)})
    info = TokenInfo.from_vocab(vocab)
    insts = [{"index": 10 + k, "input_ids": seq(20 + k, 10, pad=0, seed=k), "nsp_label": k % 2,
              "token_type_ids": np.r_[[0] * (22 + k), [1] * 11]} for k in range(4)]
    col = Collator(info, MaskingConfig(), seed=7, pad_to_multiple_of=8)
    b = col(insts, epoch=0)
    assert b["input_ids"].shape == (4, 40) and b["nsp_labels"].tolist() == [0, 1, 0, 1]
    assert (b["attention_mask"].sum(1) == 1 + 20 + 1 + 10 + 1 + np.arange(4)).all().item()
    assert (b["mlm_labels"][b["attention_mask"] == 0] == -100).all()
    # same instance alone, as (index, instance), in another order: same masks
    b2 = Collator(info, MaskingConfig(), seed=7)([(13, insts[3]), (11, insts[1])], epoch=0)
    n = int(b2["attention_mask"][0].sum())
    assert (b2["input_ids"][0, :n] == b["input_ids"][3, :n]).all()
    assert (b2["mlm_labels"][1] [: 33] == b["mlm_labels"][1, :33]).all()
    # another epoch: other masks
    b3 = col(insts, epoch=1)
    assert not (b3["mlm_labels"] == b["mlm_labels"]).all()


def test_collator_static_uses_stored_masks():
    info = TokenInfo(V, PAD, CLS, SEP, MASK)
    x = seq(5, 5, pad=0)
    inst = {"index": 0, "input_ids": x, "token_type_ids": np.zeros(len(x), dtype=np.int64), "nsp_label": -1,
            "masked_lm_positions": np.array([2, 4]), "masked_lm_ids": np.array([555, 666])}
    b = Collator(info, None, seed=0)([inst])
    assert "nsp_labels" not in b
    assert b["mlm_labels"][0].tolist() == [-100, -100, 555, -100, 666] + [-100] * (len(x) - 5)
    assert b["input_ids"][0].tolist() == x.tolist()


def test_mask_many_matches_per_sequence_rule():
    from bertkit.data.masking import mask_many
    seqs = [seq(n, m, pad=0, seed=n) for n, m in ((5, 3), (60, 60), (1, 1), (200, 100), (10, 0))]
    seqs[-1] = seqs[-1][:-1]
    flat = np.concatenate(seqs)
    offsets = np.r_[0, np.cumsum([len(x) for x in seqs])]
    cfg = MaskingConfig()
    n_mask = n_sel = 0
    for s in range(40):
        masked, pos, ids, moff = mask_many(flat, offsets, cfg, np.random.default_rng(s), V, MASK, SPECIAL)
        for i, x in enumerate(seqs):
            p = pos[moff[i]:moff[i + 1]]
            assert len(p) == num_to_predict(int((~np.isin(x, SPECIAL)).sum()), cfg)
            assert (np.diff(p) > 0).all() and not np.isin(x[p], SPECIAL).any()
            assert (ids[moff[i]:moff[i + 1]] == x[p]).all()
            m = masked[offsets[i]:offsets[i + 1]]
            untouched = np.ones(len(x), bool)
            untouched[p] = False
            assert (m[untouched] == x[untouched]).all()
            n_mask += int((m[p] == MASK).sum())
        n_sel += len(pos)
    assert abs(n_mask / n_sel - 0.8) < 0.03
    ww = mask_many(flat, offsets, MaskingConfig(mode="whole_word"), np.random.default_rng(0), V, MASK, SPECIAL,
                   np.zeros(V, bool))
    assert len(ww[1]) == sum(num_to_predict(int((~np.isin(x, SPECIAL)).sum()), cfg) for x in seqs)
