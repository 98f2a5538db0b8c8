"""Count-based reference points for held-out MLM accuracy: which stage has a model reached?

For each token of the held-out text, predict it from counts over the training text, with the
neighbours visible (as an MLM sees them when one token is masked):

    unigram      always the most frequent piece
    left         the most frequent piece after the left neighbour (backs off to unigram)
    left+right   the most frequent piece between the two neighbours (backs off to left)

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--heldout", required=True)
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
    print(json.dumps({"heldout_tokens": n, "vocab_size": tok.vocab_size, "unigram": round(hits_u / n, 4),
                      "left": round(hits_l / n, 4), "left_right": round(hits_b / n, 4)}))


if __name__ == "__main__":
    main()
