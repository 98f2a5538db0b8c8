"""Count-based reference points for held-out MLM accuracy: which stage has a model reached?

For each token of the held-out text, predict it from counts over the training text, with the
neighbours visible (as an MLM sees them when one token is masked):

    unigram      always the most frequent piece
    left         the most frequent piece after the left neighbour (backs off to unigram)
    left+right   the most frequent piece between the two neighbours (backs off to left)

    --neural N   a *trained* linear neighbours model (the left and the right piece's embeddings summed,
                 an output matrix and bias: no attention, no depth) fitted on the same masked stream an
                 MLM sees (15% chosen, 80/10/10, batches of 32 sequences of <= 128 pieces, AdamW 2e-3)
                 for N updates, scored at [MASK] on held-out sequences: what reading the neighbours is
                 worth at a given number of updates, to set against a Transformer's eval_mask_accuracy

A model below `left` has not yet learned to read its neighbours; `left+right` is roughly where a
model that reads only the adjacent tokens tops out (it uses counts of this very training text, so it
is an optimistic local model). Scores every held-out token, not a 15% sample, so compare with an MLM's
accuracy as a stage, not to the third decimal.

    python benchmarks/mlm_oracles.py --tokenizer runs/quickstart/tokenizer \
        --train runs/quickstart/text/train.txt --heldout runs/quickstart/text/heldout.txt
"""
from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict


def lines(path: str) -> list[str]:
    with open(path, encoding="utf-8") as fh:
        return [ln.strip() for ln in fh if ln.strip()]


def sequences(tok, texts: list[str], length: int = 128) -> list[list[int]]:
    """Consecutive lines packed into [CLS] ... [SEP] rows of at most `length` pieces."""
    rows, cur = [], []
    for ids in tok.encode_ids(texts):
        ids = ids[: length - 2]
        if cur and len(cur) + len(ids) > length - 2:
            rows.append(cur)
            cur = []
        cur = cur + ids
    if cur:
        rows.append(cur)
    return [[tok.cls_id, *r, tok.sep_id] for r in rows]


def neural_neighbours(tok, train: list[str], heldout: list[str], updates: int, seed: int = 0) -> float:
    """[MASK] accuracy of the linear neighbours model after `updates` AdamW steps (see the docstring)."""
    import random

    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    rng, V, C = random.Random(seed), tok.vocab_size, 128
    special = {tok.cls_id, tok.sep_id, tok.pad_id}
    train_rows, held_rows = sequences(tok, train), sequences(tok, heldout)[:400]

    def batch(rows, rng, mask_only=False):
        T = max(map(len, rows))
        x = torch.full((len(rows), T), tok.pad_id)
        y = torch.full((len(rows), T), -100)
        for b, r in enumerate(rows):
            r = list(r)
            cand = [j for j, t in enumerate(r) if t not in special]
            for j in rng.sample(cand, max(1, round(0.15 * len(cand)))):
                y[b, j], u = r[j], rng.random()
                if mask_only or u < 0.8:
                    r[j] = tok.mask_id
                elif u < 0.9:
                    r[j] = rng.randrange(V)
            x[b, :len(r)] = torch.tensor(r)
        return x, y

    emb = {k: torch.nn.Parameter(torch.randn(V, C) * 0.02) for k in ("left", "right", "out")}
    bias = torch.nn.Parameter(torch.zeros(V))
    opt = torch.optim.AdamW([*emb.values(), bias], lr=2e-3, weight_decay=0.0)

    def logits(x):
        h = emb["left"][F.pad(x, (1, 0))[:, :-1]] + emb["right"][F.pad(x, (0, 1))[:, 1:]]
        return h @ emb["out"].T + bias

    order, at = list(range(len(train_rows))), len(train_rows)
    for step in range(updates):
        if at + 32 > len(order):
            rng.shuffle(order)
            at = 0
        x, y = batch([train_rows[j] for j in order[at:at + 32]], rng)
        at += 32
        loss = F.cross_entropy(logits(x).flatten(0, 1), y.flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
    hit = n = 0
    scoring = random.Random(123)
    with torch.no_grad():
        for i in range(0, len(held_rows), 32):
            x, y = batch(held_rows[i:i + 32], scoring, mask_only=True)
            keep = y != -100
            hit += (logits(x).argmax(-1)[keep] == y[keep]).sum().item()
            n += keep.sum().item()
    return hit / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--neural", type=int, default=0, metavar="N",
                    help="also train the linear neighbours model for N updates (one thread: ~0.4 s each)")
    args = ap.parse_args()
    from bertkit import Tokenizer

    tok = Tokenizer.from_dir(args.tokenizer)
    bos, eos = -1, -2                          # sentence edges as neighbours
    uni: Counter = Counter()
    left: dict = defaultdict(Counter)
    both: dict = defaultdict(Counter)
    for ids in tok.encode_ids(lines(args.train)):
        s = [bos, *ids, eos]
        for i in range(1, len(s) - 1):
            uni[s[i]] += 1
            left[s[i - 1]][s[i]] += 1
            both[(s[i - 1], s[i + 1])][s[i]] += 1
    top = uni.most_common(1)[0][0]
    best_left = {k: c.most_common(1)[0][0] for k, c in left.items()}
    n = hits_u = hits_l = hits_b = 0
    for ids in tok.encode_ids(lines(args.heldout)):
        s = [bos, *ids, eos]
        for i in range(1, len(s) - 1):
            w, guess_l = s[i], best_left.get(s[i - 1], top)
            c = both.get((s[i - 1], s[i + 1]))
            n += 1
            hits_u += w == top
            hits_l += w == guess_l
            hits_b += w == (c.most_common(1)[0][0] if c else guess_l)
    result = {"heldout_tokens": n, "vocab_size": tok.vocab_size, "unigram": round(hits_u / n, 4),
              "left": round(hits_l / n, 4), "left_right": round(hits_b / n, 4)}
    if args.neural:
        result.update(neural_updates=args.neural, neural_left_right_at_mask=round(
            neural_neighbours(tok, lines(args.train), lines(args.heldout), args.neural), 4))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
