"""Held-out MLM accuracy against input length, for a model with ALiBi (no position table, so it
reads inputs past its training length: `--max-length` beyond max_position_embeddings).

Only the context changes from one length to the next. Each held-out document is one stream of word
pieces (its sentence lines' pieces back to back, as `prepare`'s full-sentence sequences), cut to a
whole number of the longest length's windows, S = k (L - 2) pieces (L = the longest length), so
that every length scores the same pieces. The stream is masked once, as pre-training masks (token
mode, 15% of the pieces, of those 80% [MASK], 10% a random piece, 10% kept; no per-sequence cap;
rng (seed, document number)). For each length N the masked stream is then cut into consecutive
windows of N - 2 pieces, each read as [CLS] window [SEP] (the last window of a document is shorter
where N - 2 does not divide S), and the same predictions are scored: accuracy over all of them,
accuracy where the input showed [MASK] (pre-training's eval_mask_accuracy) and the loss.

Documents shorter than L - 2 pieces would give the long lengths shorter inputs than their name
says; they are left out (the output counts them), and the first S pieces of the others are used.

    python benchmarks/mlm_vs_length.py --model runs/quickstart/final            # quickstart's held-out split
    python benchmarks/mlm_vs_length.py --model DIR --documents held.txt --lengths 128,512,2048 --json

--documents: a text file of documents separated by blank lines, one sentence per line (.gz read
too); default: the held-out documents of `bertkit quickstart`'s split of the bundled corpus
(`bertkit.quickstart.quickstart_corpus`), which its model was not trained on.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

LENGTHS = (128, 256, 512, 1024, 2048)


def read_documents(path: str | None) -> list[str]:
    if path is None:
        from bertkit.quickstart import quickstart_corpus
        return quickstart_corpus()[1]
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [d for d in fh.read().split("\n\n") if d.strip()]


def document_streams(tok, documents: list[str], longest: int) -> tuple[list[np.ndarray], int]:
    """(the kept documents' piece streams, each cut to a multiple of longest - 2 pieces; how many
    documents were left out for being shorter than longest - 2 pieces)."""
    block, kept, short = longest - 2, [], 0
    for doc in documents:
        lines = [ln for ln in doc.split("\n") if ln.strip()]
        ids = np.array([i for piece in tok.encode_ids(lines) for i in piece], dtype=np.int64)
        if len(ids) < block:
            short += 1
            continue
        kept.append(ids[:len(ids) // block * block])
    return kept, short


def mask_streams(streams: list[np.ndarray], tok, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each stream masked once: (input ids, labels), labels -100 where nothing is predicted."""
    from bertkit.data.masking import MaskingConfig, mask_sequence

    cfg = MaskingConfig(mode="token", mask_prob=0.15, max_predictions=1 << 30)
    special = [tok.cls_id, tok.sep_id, tok.pad_id, tok.mask_id]
    return [mask_sequence(s, cfg, np.random.default_rng([seed, d]), tok.vocab_size, tok.mask_id, special)
            for d, s in enumerate(streams)]


def windows(masked: list[tuple[np.ndarray, np.ndarray]], length: int, cls: int, sep: int):
    """[CLS] piece.. [SEP] rows of at most `length` tokens and their labels, grouped by row length."""
    groups: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    step = length - 2
    for ids, labels in masked:
        for a in range(0, len(ids), step):
            row = np.concatenate([[cls], ids[a:a + step], [sep]])
            lab = np.concatenate([[-100], labels[a:a + step], [-100]])
            groups.setdefault(len(row), []).append((row, lab))
    return groups


@torch.no_grad()
def score(model, masked: list[tuple[np.ndarray, np.ndarray]], length: int, cls: int, sep: int, mask_id: int,
          batch_tokens: int = 16384) -> dict:
    """Accuracy, [MASK] accuracy and loss over every prediction of the streams read in `length`-token windows."""
    right = shown = shown_right = count = 0
    loss, rows_read = 0.0, 0
    for n, rows in sorted(windows(masked, length, cls, sep).items()):
        B = max(1, batch_tokens // n)
        for s in range(0, len(rows), B):
            ids = torch.from_numpy(np.stack([r for r, _ in rows[s:s + B]]))
            labels = torch.from_numpy(np.stack([l for _, l in rows[s:s + B]]))
            hidden = model.bert(ids)                                     # (B, n, C): one length, no padding
            chosen = labels != -100
            logits = model.mlm(hidden[chosen]).float()                   # (M, V)
            target = labels[chosen]
            hit = logits.argmax(-1) == target
            at_mask = ids[chosen] == mask_id
            right += int(hit.sum())
            shown += int(at_mask.sum())
            shown_right += int(hit[at_mask].sum())
            count += len(target)
            loss += float(F.cross_entropy(logits, target, reduction="sum"))
            rows_read += len(ids)
    return {"length": length, "windows": rows_read, "predictions": count, "accuracy": right / max(count, 1),
            "mask_accuracy": shown_right / max(shown, 1), "loss": loss / max(count, 1)}


def measure(model_dir: str, documents: list[str], lengths=LENGTHS, seed: int = 0) -> dict:
    """The table for one model: a row per length, plus what was read."""
    from bertkit.checkpoint import check_inputs_fit, load_model, trained_length
    from bertkit.tokenizer import Tokenizer

    model = load_model(model_dir, head="masked_lm").eval()
    check_inputs_fit(model.config, max_length=max(lengths), option="--lengths")   # a position table: one line
    tok = Tokenizer.from_dir(model_dir)
    streams, short = document_streams(tok, documents, max(lengths))
    if not streams:
        raise SystemExit(f"no document has {max(lengths) - 2} word pieces; give longer ones (--documents)")
    masked = mask_streams(streams, tok, seed)
    rows = []
    for n in lengths:
        t0 = time.perf_counter()
        rows.append({**score(model, masked, n, tok.cls_id, tok.sep_id, tok.mask_id),
                     "seconds": round(time.perf_counter() - t0, 1)})
    return {"model": str(model_dir), "trained_length": trained_length(model.config),
            "max_position_embeddings": model.config.max_position_embeddings,
            "documents": len(streams), "documents_too_short": short,
            "pieces": int(sum(len(s) for s in streams)), "seed": seed, "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="checkpoint folder with an MLM head and its tokenizer")
    p.add_argument("--documents", default=None, help="held-out text (default: the quickstart's held-out split)")
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="comma-separated input lengths")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    lengths = sorted({int(x) for x in args.lengths.split(",")})
    if lengths[0] < 3:
        p.error("--lengths: each at least 3")
    if args.threads:
        torch.set_num_threads(args.threads)
    from bertkit.errors import BertkitError
    try:
        result = measure(args.model, read_documents(args.documents), lengths, args.seed)
    except BertkitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['documents']} documents, {result['pieces']:,} pieces ({result['documents_too_short']} shorter "
          f"than {lengths[-1] - 2} pieces left out); trained at {result['trained_length']} tokens")
    print(f"{'length':>7s} {'windows':>8s} {'predictions':>12s} {'accuracy':>9s} {'[MASK] acc':>11s} {'loss':>7s}")
    for r in result["rows"]:
        print(f"{r['length']:7d} {r['windows']:8d} {r['predictions']:12d} {r['accuracy']:9.4f} "
              f"{r['mask_accuracy']:11.4f} {r['loss']:7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
