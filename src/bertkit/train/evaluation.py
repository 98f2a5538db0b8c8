"""Evaluation during pre-training: the held-out set masked once, and on it the MLM loss, accuracy
(also at the positions shown as [MASK] alone), perplexity and NSP accuracy (for train.objective=clm:
next-token loss, accuracy and perplexity), summed over every rank; each point is logged to
eval.jsonl with where on the training clock it lies.
"""
from __future__ import annotations

import logging
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, fields

import torch

from .. import distributed as D
from ..data.masking import Collator
from ..runconfig import PretrainConfig
from ..runlog import to_board
from ..runstate import Phase, Run
from .model import forward

log = logging.getLogger("bertkit")


@dataclass
class EvalSums:
    """Sums over the held-out batches (all ranks)."""
    mlm_loss: float = 0.0        # MLM (next-token) loss x predictions: a sum over predicted tokens
    mlm_correct: float = 0.0
    mlm_count: float = 0.0       # predicted tokens
    mask_correct: float = 0.0    # ... of them, those whose input was [MASK] (80%: no copy of the answer in view)
    mask_count: float = 0.0
    nsp_correct: float = 0.0
    nsp_count: float = 0.0


def eval_batches(cfg: PretrainConfig, phase: Phase, world: D.World) -> list[dict]:
    """The held-out set (`phase.held_out`), masked once (seed + 1, epoch 0) as training masks, split across ranks."""
    data, idx = phase.held_out.data, phase.held_out.indices
    if data is None or not len(idx):
        return []
    collator = Collator(data, phase.collator.cfg, seed=cfg.train.seed + 1, objective=phase.collator.objective)
    mine = idx[world.rank::world.world_size]
    B = cfg.train.batch_size
    return [collator([data[int(i)] for i in mine[s:s + B]], epoch=0) for s in range(0, len(mine), B)]


@torch.no_grad()
def evaluate(run: Run) -> dict | None:
    """Held-out MLM loss (per predicted token), accuracy, perplexity and NSP accuracy; for
    train.objective=clm the next-token loss, accuracy and perplexity (eval_next_token_*)."""
    if not run.eval_batches and not run.world.distributed:
        return None
    model, world = run.wrapped, run.world
    run.model.eval()
    s = EvalSums()
    autocast = torch.autocast(world.device.type, dtype=run.precision) if run.precision != torch.float32 \
        else nullcontext()
    mask_id = getattr(getattr(run.phases[0].collator, "info", None), "mask_id", None)
    for batch in run.eval_batches:
        batch = {k: v.to(world.device) for k, v in batch.items()}
        with autocast:
            out = forward(model, batch, run.packed)
        m = out["mlm_targets"].numel()
        right = out["mlm_logits"].argmax(-1) == out["mlm_targets"]
        s.mlm_loss += out["mlm_loss"].double().item() * m
        s.mlm_correct += right.sum().item()
        s.mlm_count += m
        if mask_id is not None and "mlm_labels" in batch:       # predictions come in the labels' row-major order (select_masked)
            chosen = batch["mlm_labels"] != -100
            shown = batch["input_ids"][chosen] == mask_id                   # the input at each prediction
            if shown.numel() == m and torch.equal(batch["mlm_labels"][chosen], out["mlm_targets"]):
                s.mask_correct += right[shown].sum().item()
                s.mask_count += shown.sum().item()
        if "nsp_logits" in out and "nsp_labels" in batch:
            s.nsp_correct += (out["nsp_logits"].argmax(-1) == batch["nsp_labels"]).sum().item()
            s.nsp_count += len(batch["nsp_labels"])
    totals = torch.tensor([getattr(s, f.name) for f in fields(EvalSums)], dtype=torch.float64, device=world.device)
    s = EvalSums(*D.all_reduce_sum(totals, world).cpu().tolist())
    run.model.train()
    if s.mlm_count == 0:
        return None
    loss = s.mlm_loss / s.mlm_count
    if run.cfg.train.objective == "clm":
        rec = {"step": run.state.step, "eval_next_token_loss": loss,
               "eval_next_token_accuracy": s.mlm_correct / s.mlm_count,
               "eval_next_token_perplexity": math.exp(min(loss, 50.0)), "eval_predictions": int(s.mlm_count)}
    else:
        rec = {"step": run.state.step, "eval_mlm_loss": loss, "eval_mlm_accuracy": s.mlm_correct / s.mlm_count,
               "eval_perplexity": math.exp(min(loss, 50.0)), "eval_predictions": int(s.mlm_count)}
        if s.mask_count:                # BERT's accuracy counts the 10% left unchanged, which a model copies
            rec["eval_mask_accuracy"] = s.mask_correct / s.mask_count
    rec["eval_nsp_accuracy"] = s.nsp_correct / s.nsp_count if s.nsp_count else None
    return rec


def timed_eval(run: Run, evals, board, bar) -> float:
    """Evaluate and log; returns the seconds it took (the loop takes them off its training clock)."""
    t = time.perf_counter()
    eval_and_log(run, evals, board, bar)
    run.last_eval_elapsed = run.state.elapsed
    return time.perf_counter() - t


def eval_and_log(run: Run, evals, board, bar) -> dict | None:
    rec = evaluate(run)
    if rec is not None:      # where on the training clock the point lies: curves against time or tokens
        rec.update(elapsed_s=round(run.state.elapsed, 3), tokens=run.state.tokens)
    run.last_eval = rec
    if rec and run.world.main:
        evals.write(rec)
        to_board(board, "eval", rec, rec["step"])
        name, lm = ("next-token", "eval_next_token") if "eval_next_token_loss" in rec else ("MLM", "eval_mlm")
        at_mask = f" (at [MASK] {rec['eval_mask_accuracy']:.4f})" if "eval_mask_accuracy" in rec else ""
        nsp = f", NSP accuracy {rec['eval_nsp_accuracy']:.4f}" if rec["eval_nsp_accuracy"] is not None else ""
        msg = (f"update {rec['step']}: held-out {name} loss {rec[lm + '_loss']:.4f}, accuracy "
               f"{rec[lm + '_accuracy']:.4f}{at_mask}, perplexity "
               f"{rec.get('eval_perplexity', rec.get('eval_next_token_perplexity')):.1f}{nsp}")
        (bar.write(msg) if bar is not None else log.info(msg))
    return rec
