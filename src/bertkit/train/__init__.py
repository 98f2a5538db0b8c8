"""Pre-training with MLM (+ NSP): an explicit loop you can read top to bottom.

This file is the loop: setup, one update, the end; the run state (`runstate.Run`, a dataclass;
`runstate.State` is the part a checkpoint saves) is shared by all of them. Around it, in this package:

    pretrain() / _loop()   the loop: update, log, evaluate, checkpoint, stop (signal, budget, non-finite)
    setup()        model, optimizer, data, device, precision; resume from the latest valid checkpoint
    train_step()   one update: micro-batches (gradient accumulation), clipping, a non-finite guard
    finish()       the final model folder, run card and curves
    phases.py      the data: phases, their masking and held-out set; which instances a micro-batch takes
    model.py       the model a run starts from (new, model.init_from's, a checkpoint's) and `forward`
    evaluation.py  MLM loss / accuracy / perplexity and NSP accuracy on the held-out set
    runstate.save_checkpoint() / find_checkpoint()   atomic, last K kept, HF model folder inside
    runlog.py      metrics JSONL, the run card, the plot

Determinism is by construction, so a resumed run and a run on more processes see the same
numbers: the order of instances is a permutation drawn from (seed, epoch); the masks are a pure
function of (seed, epoch, index) (`data.masking.Collator`); dropout is re-seeded from (seed,
update, micro-batch) before each micro-batch; the learning rate is `optim.lr_at(step)`. The data
position saved in a checkpoint is (phase, epoch, update within epoch).

Global batch = batch_size x grad_accum x world size. Micro-batch g of an update (g = j * world +
rank for accumulation step j) takes instances [g*B, (g+1)*B) of the update's slice of the
permutation, so 1 process x 2 accumulation steps and 2 processes x 1 see the same sequences.
"""
from __future__ import annotations

import copy
import logging
import math
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .. import distributed as D
from ..hardware import PRECISION_NAMES, attention_kernel, choose_precision, deterministic, dtype_name
from ..model import num_parameters, set_attention_kernel
from ..optim import build_optimizer, lr_at
from ..packing import varlen_runs
from ..runconfig import PretrainConfig, RunConfigError, parse_duration, save_config
from ..runlog import (MetricsLog, Window, bar_update, plot_curves, pretrain_card, progress_bar, step_flops,
                      tensorboard_writer, to_board, write_run_card)
from ..runstate import Phase, Run, State, Step, export_model, find_checkpoint, load_checkpoint, save_checkpoint, saved_state
from ..sources import read_jsonl
from .evaluation import eval_and_log, eval_batches, timed_eval
from .model import build_model, forward
from .phases import build_phases, data_fill, micro_batches

log = logging.getLogger("bertkit")


@dataclass
class StepSums:
    """Sums over micro-batches of one update: this rank's, then all ranks' (one all-reduce)."""
    loss: float = 0.0            # per micro-batch: the mean loss (MLM + NSP) over its batch
    mlm_loss: float = 0.0        # the mean MLM (or next-token) loss
    nsp_loss: float = 0.0        # the mean NSP loss (0 without NSP)
    mlm_correct: float = 0.0     # predictions that were right
    mlm_count: float = 0.0       # predicted tokens (masked, or next tokens)
    nsp_correct: float = 0.0
    nsp_count: float = 0.0       # sentence pairs with an NSP label
    real_tokens: float = 0.0     # tokens that are not padding
    padded_tokens: float = 0.0   # batch x length, padding included
    sequences: float = 0.0


def pretrain(cfg: PretrainConfig, command: str = "", on_step: Callable[[State], None] | None = None) -> dict:
    """Run pre-training as configured; returns the run card (also written to `cfg.out`).

    `on_step(state)`, if given, is called right after each update (before it is logged, evaluated
    or checkpointed) with the loop state (`runstate.State`: step, tokens, elapsed, ...); it should
    only read it. A test of crash recovery, for one, kills the process there."""
    world = D.init()
    threads = torch.get_num_threads()
    try:
        run = setup(cfg, world)
        try:
            card = _loop(run, command, on_step)
        finally:
            run.pool.shutdown(wait=True, cancel_futures=True)
        D.barrier(world)        # every rank past its last collective before the group goes (gloo aborts now and then)
        return card
    finally:
        torch.set_num_threads(threads)
        D.teardown()


def _loop(run: Run, command: str, on_step: Callable[[State], None] | None) -> dict:
    cfg, world = run.cfg, run.world
    out, st, tc = Path(cfg.out), run.state, cfg.train
    stop = _StopFlag()
    metrics = MetricsLog(out / "metrics.jsonl", keep_until_step=st.step if run.resumed else None) if world.main else None
    evals = MetricsLog(out / "eval.jsonl", keep_until_step=st.step if run.resumed else None) if world.main else None
    board = tensorboard_writer(out) if tc.tensorboard and world.main else None
    if not run.resumed:
        eval_and_log(run, evals, board, None)          # the untrained model, for "before / after"
    if run.budget and not st.planned_steps:
        st.planned_steps = plan_budget(run)
    total = total_steps(run)
    bar = progress_bar(cfg, st, world, total)
    window = Window()
    start, last_ckpt = time.perf_counter() - st.elapsed, time.perf_counter()
    stop_reason = "max_steps" if total == tc.max_steps else f"budget: {total} updates planned"
    with stop.installed():
        while st.step < total:
            _maybe_switch_phase(run)
            s = train_step(run)
            if on_step is not None:
                on_step(st)
            st.elapsed = D.mean_over_ranks(time.perf_counter() - start, world)
            window.add(s)
            if bar is not None:
                bar_update(bar, run, s)
            if st.bad_steps >= tc.max_bad_steps:
                stop_reason = f"{st.bad_steps} non-finite losses in a row"
                log.error("stopping: %s (lower optim.lr or use fp32/bf16); a checkpoint is saved", stop_reason)
                break
            if st.step % tc.log_every == 0:                # (train.log_every >= 1)
                if world.main:
                    rec = window.record(st, run)
                    metrics.write(rec)
                    to_board(board, "train", rec, st.step)
                window = Window()
            if (tc.eval_every and st.step % tc.eval_every == 0) or \
                    (tc.eval_minutes and st.elapsed - run.last_eval_elapsed >= 60 * tc.eval_minutes):
                start += timed_eval(run, evals, board, bar)      # evaluation time is not training time
            due = (tc.checkpoint_every and st.step % tc.checkpoint_every == 0) or \
                D.all_ranks_agree(bool(tc.checkpoint_minutes) and time.perf_counter() - last_ckpt
                                  >= 60 * tc.checkpoint_minutes, world)
            if D.all_ranks_agree(stop.signum is not None, world):
                stop_reason = f"signal {signal.Signals(stop.signum).name if stop.signum else ''}".strip()
                log.warning("%s received: saving a checkpoint at update %d and stopping", stop_reason, st.step)
                break
            if due:
                save_checkpoint(run, world)
                last_ckpt = time.perf_counter()
    if bar is not None:
        bar.close()
    if world.main and window.n:                     # the last updates, if they did not end a log window
        metrics.write(window.record(st, run))
    if run.saved_step != st.step:
        save_checkpoint(run, world)
    last = run.last_eval
    final_eval = last if last is not None and last.get("step") == st.step else eval_and_log(run, evals, board, None)
    card = finish(run, world, stop_reason, final_eval, command)
    if board is not None:
        board.close()
    return card


# ---- setup ---------------------------------------------------------------------------------------
def setup(cfg: PretrainConfig, world: D.World) -> Run:
    tc = cfg.train
    if tc.threads:
        torch.set_num_threads(tc.threads)
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise RunConfigError(f"out {cfg.out}: a file, not a folder")
    budget = parse_duration(tc.budget, "train.budget") if tc.budget else 0.0
    determinism = deterministic(world.device, tc.deterministic)     # before the first GPU matrix product
    phases, tokenizer = build_phases(cfg, world)
    ckpt = find_checkpoint(out / "checkpoints") if cfg.resume else None
    if cfg.resume and ckpt is None:
        log.warning("--resume: no valid checkpoint in %s; starting from scratch", out / "checkpoints")
    model = build_model(cfg, tokenizer.vocab_size, ckpt, world).to(world.device)   # (init_from: cfg.model says what it is)
    longest = max(ph.max_len for ph in phases)
    if longest > model.config.max_position_embeddings:
        raise RunConfigError(f"model.max_position_embeddings is {model.config.max_position_embeddings}, shorter than the "
                             f"prepared sequences ({longest} tokens, {phases[-1].path}): give at least {longest}, or "
                             f"prepare the data with --max_length {model.config.max_position_embeddings}")
    for k in ("hidden_dropout", "attention_dropout"):      # None: the model's (0.1 new, a checkpoint's own)
        if getattr(cfg.model, k) is None:
            setattr(cfg.model, k, getattr(model.config, k))     # so config.yaml says what trains
    if world.main:
        out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out / "config.yaml")
        tokenizer.save(out / "tokenizer")
    choices, chosen, changes = machine_choices(cfg, world, model, phases, ckpt)
    set_attention_kernel(model, chosen["attention_kernel"])
    model.config.extra["bertkit_run"] = dict(choices)     # config.json of every checkpoint and final/ says it
    said = model.config.extra.get("bertkit_trained_length")    # (an init_from model's own)
    model.config.extra["bertkit_trained_length"] = max(longest, said if isinstance(said, int) else 0)
    wrapped = D.parallelize(model, world, tc.distributed, tc.compile)
    # torch's fused AdamW: the same update in one pass over the weights (timed in docs/pretrain.md);
    # not under FSDP, whose sharded parameters take the per-tensor loop
    optimizer = build_optimizer(model, cfg.optim.optimizer, cfg.optim.lr, cfg.optim.weight_decay,
                                cfg.optim.betas, cfg.optim.eps,
                                fused=cfg.optim.optimizer == "adamw" and not (world.distributed and tc.distributed == "fsdp"))
    scaler = torch.amp.GradScaler("cuda") if chosen["precision"] == torch.float16 else None
    state = State()
    run = Run(cfg=cfg, world=world, model=model, wrapped=wrapped, optimizer=optimizer, scaler=scaler,
              state=state, phases=phases, tokenizer=tokenizer, deterministic=determinism, budget=budget,
              resumed=ckpt is not None, eval_batches=eval_batches(cfg, phases[0], world),
              pool=ThreadPoolExecutor(1, thread_name_prefix="bertkit-data"), **chosen)
    if ckpt is not None:
        load_checkpoint(run, ckpt, world)
        log.info("resumed from %s (update %d)", ckpt, state.step)
    state.choices = dict(choices)
    state.changes += [[state.step, *c] for c in changes]
    if world.main:
        log.info("model %s: %s parameters, vocab %d; global batch %d (%d per device x %d accumulation x %d "
                 "processes); %s, %s path, %s", cfg.model.preset, f"{num_parameters(model):,}", tokenizer.vocab_size,
                 phases[0].batch_size * phases[0].grad_accum * world.world_size, phases[0].batch_size,
                 phases[0].grad_accum, world.world_size, dtype_name(run.precision),
                 "packed" if run.packed else "padded", world.device)
    return run


def machine_choices(cfg: PretrainConfig, world: D.World, model, phases: list[Phase],
                    ckpt: Path | None) -> tuple[dict, dict, list]:
    """Precision, attention kernel and padded/padding-free: each made once, at the start of a run.
    'auto' takes what the run being resumed (or the model.init_from model, on the same kind of device)
    ran with, as its checkpoint records it; else it is decided for this machine, by a measurement
    that is itself made once per machine (`hardware.measured_once`). So a rerun, a resume and a
    continued run compute as the first run did. Returns (choices, each choice and its reason as `Run`'s
    fields, changes), `changes` being (key, before, after) where an explicit setting overrides a resumed run's."""
    tc = cfg.train
    before, where = {}, ""
    if ckpt is not None:
        before, where = saved_state(ckpt).get("choices") or model.config.extra.get("bertkit_run") or {}, \
            f"the checkpoint {ckpt.name}"
    elif cfg.model.init_from:
        before, where = model.config.extra.get("bertkit_run") or {}, f"model.init_from {cfg.model.init_from}"
    if not isinstance(before, dict) or before.get("device") != world.device.type:
        before = {}                                         # none recorded, or chosen for another device
    asked = {"precision": tc.precision, "attention_kernel": tc.attention, "packed": str(tc.packed).lower()}
    reused = {k: str(before[k]).lower() for k in asked if asked[k] == "auto" and k in before}
    changes = [(k, before[k], asked[k]) for k in asked
               if ckpt is not None and asked[k] != "auto" and k in before and str(before[k]).lower() != asked[k]]
    for k, old, new in changes:
        log.warning("train.%s=%s, where the run being resumed ran with %s: from here it computes otherwise "
                    "(the run card records the change)", k if k != "attention_kernel" else "attention", new, old)
    said = {k: f"as {where} ran (train.{k if k != 'attention_kernel' else 'attention'}=auto)" for k in reused}
    precision, why = choose_precision(reused.get("precision", tc.precision), world.device, model.config,
                                      "train.precision")
    packed, packed_why = resolve_packed(reused.get("packed", tc.packed), world.device, precision, model.config,
                                        lambda: data_fill(phases[0]))
    kernel, kernel_why = attention_kernel(world.device, precision, model.config, phases[0].max_len or 128,
                                          reused.get("attention_kernel", tc.attention))
    chosen = {"precision": precision, "precision_reason": said.get("precision", why), "packed": packed,
              "packed_reason": said.get("packed", packed_why), "attention_kernel": kernel,
              "attention_kernel_reason": said.get("attention_kernel", kernel_why)}
    choices = {"device": world.device.type, "precision": PRECISION_NAMES[precision], "attention_kernel": kernel,
               "packed": packed}
    return choices, chosen, changes


CALIBRATION_SECONDS = 3.0    # a time budget is turned into updates by timing this long (and >= 3 updates)


def plan_budget(run: Run) -> int:
    """train.budget turned into a number of updates, once, at the start of the run: a few updates
    are timed and then undone (weights, optimizer, loop state and RNG restored), and the run does
    budget / (seconds per update) updates, its schedule a function of the update as in a run bounded
    by max_steps. So the plan is the only thing the clock decides: the checkpoint and the run card
    record it, --resume continues it, and --train.max_steps=N without a budget reproduces the run bit
    for bit. A max_steps below the plan ends the run as it would without a budget."""
    st, world = run.state, run.world
    saved = (copy.deepcopy(st), {k: v.detach().clone() for k, v in run.model.state_dict().items()},
             copy.deepcopy(run.optimizer.state_dict()), torch.get_rng_state(),
             copy.deepcopy(run.scaler.state_dict()) if run.scaler is not None else None)
    times: list[float] = []
    until = time.perf_counter() + min(CALIBRATION_SECONDS, 0.05 * run.budget)
    while D.all_ranks_agree(len(times) < 3 or (time.perf_counter() < until and len(times) < 20), world):
        t0 = time.perf_counter()
        train_step(run)
        times.append(time.perf_counter() - t0)
    state, weights, optim, rng, scaler = saved
    run.model.load_state_dict(weights)
    run.optimizer.load_state_dict(optim)
    run.optimizer.zero_grad(set_to_none=True)
    if scaler is not None:
        run.scaler.load_state_dict(scaler)
    torch.set_rng_state(rng)
    for f in fields(State):
        setattr(st, f.name, getattr(state, f.name))
    pace = D.mean_over_ranks(float(np.median(times[1:])), world)     # the first update pays one-time set-up
    planned = max(1, int(run.budget / pace))
    log.info("train.budget %s at %.3f s per update (%d timed and undone): %d updates%s", run.cfg.train.budget,
             pace, len(times), planned, f", capped by train.max_steps={run.cfg.train.max_steps}"
             if run.cfg.train.max_steps < planned else "")
    return planned


def total_steps(run: Run) -> int:
    """The updates this run does and its schedule spans: max_steps, or the plan of a time budget."""
    planned = run.state.planned_steps
    return min(run.cfg.train.max_steps, planned) if planned else run.cfg.train.max_steps


# Padding-free batches pay on the CPU only where they skip much padding in a model wide enough for
# the saved work to outweigh the gathers (measured: docs/pretrain-measurements.md, the levers at
# matched wall time). Below this share of real tokens (and above hidden 128) 'auto' packs.
CPU_PACK_BELOW_FILL = 0.75
CPU_PACK_ABOVE_WIDTH = 128


def resolve_packed(name: str, device: torch.device, precision: torch.dtype, model_cfg,
                   fill: Callable[[], float | None] = lambda: None) -> tuple[bool, str]:
    """Whether the encoder runs padding-free (`packing.pack`), and why. `fill()`: the training data's
    real tokens per position of its longest instance (None: unknown); called only where CPU 'auto'
    needs it (it reads every shard's offsets). 'auto' on the CPU: padding-free
    where it skips enough padding to pay for its gathers (fill below CPU_PACK_BELOW_FILL and a model
    wider than CPU_PACK_ABOVE_WIDTH; measured above), padded otherwise (prepare's full-sentence and NSP
    data are 83-97% real tokens); on a GPU only where varlen flash attention serves it (bf16/fp16
    and no attention dropout): otherwise packed attention is one padded SDPA call plus a scatter and
    a gather per layer, and the padded path measured faster (BERT-base 256 x 128 on an H200,
    benchmarks/gpu_all.sh)."""
    choice = str(name).lower()
    if choice in ("true", "false"):
        return choice == "true", f"asked: train.packed={choice}"
    if device.type != "cuda":
        fill = fill()
        share = "" if fill is None else f"{fill:.0%} real tokens, "
        if fill is not None and fill < CPU_PACK_BELOW_FILL and model_cfg.hidden_size > CPU_PACK_ABOVE_WIDTH:
            return True, f"auto: padding-free on the CPU ({share}hidden {model_cfg.hidden_size})"
        return False, f"auto: padded on the CPU ({share}hidden {model_cfg.hidden_size}: padding-free pays " \
                      f"below {CPU_PACK_BELOW_FILL:.0%} real tokens above hidden {CPU_PACK_ABOVE_WIDTH})"
    why_not = varlen_runs(device, precision, model_cfg.attention_dropout,
                          model_cfg.position_embedding_type == "alibi")
    if why_not is not None:
        return False, f"auto: padded ({why_not})"
    return True, "auto: packed (varlen flash attention)"


# ---- one update ----------------------------------------------------------------------------------


def train_step(run: Run) -> Step:
    """One optimizer update over grad_accum micro-batches on every rank; returns global statistics."""
    cfg, st, world = run.cfg, run.state, run.world
    model, wrapped, opt, scaler = run.model, run.wrapped, run.optimizer, run.scaler
    model.train()
    batches = micro_batches(run)
    A = len(batches)
    acc = torch.zeros(len(fields(StepSums)), dtype=torch.float64, device=world.device)   # StepSums' fields, in order
    autocast = torch.autocast(world.device.type, dtype=run.precision) if run.precision != torch.float32 \
        else nullcontext()
    for j, batch in enumerate(batches):
        torch.manual_seed(_seed(cfg.train.seed, st.step, batch.pop("_g")))      # dropout: f(seed, step, g)
        with D.no_sync(wrapped, skip=j < A - 1), autocast:
            out = forward(wrapped, batch, run.packed)
            loss = out["loss"] / A
        (scaler.scale(loss) if scaler is not None else loss).backward()
        acc += _batch_stats(out, batch)
    sums = StepSums(*D.all_reduce_sum(acc, world).cpu().tolist())
    n_micro = A * world.world_size
    loss_value = sums.loss / n_micro
    finite = math.isfinite(loss_value)
    lr = _lr(run)
    for group in opt.param_groups:
        group["lr"] = lr
    if scaler is not None:
        scaler.unscale_(opt)
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, cfg.train.clip_norm if cfg.train.clip_norm > 0 else float("inf"))
    norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    if scaler is not None:
        scaler.step(opt)                          # skips by itself when the scaled gradients overflow
        scaler.update()
    elif finite and math.isfinite(norm):
        opt.step()
    opt.zero_grad(set_to_none=True)
    if finite and (scaler is not None or math.isfinite(norm)):
        st.bad_steps = 0
    else:
        st.bad_steps += 1
        st.skipped += 1
        log.warning("update %d: non-finite loss or gradient (loss %s, grad norm %s): skipped (%d in a row)",
                    st.step + 1, loss_value, norm, st.bad_steps)
    flops = step_flops(model.config, int(sums.real_tokens if run.packed else sums.padded_tokens), int(sums.sequences),
                       sums.real_tokens / max(sums.sequences, 1), int(sums.mlm_count), cfg.train.nsp)
    st.step += 1
    st.tokens += int(sums.real_tokens)
    st.flops += flops
    return Step(loss=loss_value, mlm_loss=sums.mlm_loss / n_micro, nsp_loss=sums.nsp_loss / n_micro,
                mlm_correct=sums.mlm_correct, mlm_count=sums.mlm_count, nsp_correct=sums.nsp_correct,
                nsp_count=sums.nsp_count, tokens=int(sums.real_tokens), lr=lr, grad_norm=norm, flops=flops)


def _batch_stats(out: dict, batch: dict) -> torch.Tensor:
    """`StepSums` of one micro-batch as a tensor on its device, in field order (one transfer per
    update, not per number)."""
    with torch.no_grad():
        mask = batch["attention_mask"]
        zero = mask.new_zeros((), dtype=torch.float64)
        nsp = "nsp_loss" in out
        sums = dict(
            loss=out["loss"].detach().double(), mlm_loss=out["mlm_loss"].detach().double(),
            nsp_loss=out["nsp_loss"].detach().double() if nsp else zero,
            mlm_correct=(out["mlm_logits"].argmax(-1) == out["mlm_targets"]).sum().double(),
            mlm_count=zero + out["mlm_targets"].numel(),
            nsp_correct=(out["nsp_logits"].argmax(-1) == batch["nsp_labels"]).sum().double() if nsp else zero,
            nsp_count=zero + (len(batch["nsp_labels"]) if nsp else 0),
            real_tokens=mask.sum().double(), padded_tokens=zero + mask.numel(), sequences=zero + mask.shape[0])
        return torch.stack([sums[f.name] for f in fields(StepSums)])


def _seed(*parts: int) -> int:
    return int(np.random.default_rng([abs(int(p)) for p in parts]).integers(2 ** 62))


def _lr(run: Run) -> float:
    oc, total = run.cfg.optim, total_steps(run)
    warm = oc.warmup * total if oc.warmup < 1 else oc.warmup
    return lr_at(run.state.step, total, warm, oc.lr, oc.schedule, oc.end_lr, oc.decay_fraction)


def _maybe_switch_phase(run: Run) -> None:
    st = run.state
    if len(run.phases) > 1 and st.phase != 1 and st.step / total_steps(run) >= 1 - run.cfg.train.long_fraction:
        st.phase = 1
        log.info("update %d: phase 2 (long sequences, %s)", st.step, run.phases[1].path)


# ---- stopping on a signal ------------------------------------------------------------------------


class _StopFlag:
    """SIGTERM / SIGINT set a flag; the loop saves a checkpoint at the end of the current update."""

    def __init__(self):
        self.signum = None

    def _handler(self, signum, frame):
        if self.signum is not None:               # a second Ctrl-C: stop at once
            raise KeyboardInterrupt
        self.signum = signum

    @contextmanager
    def installed(self):
        old = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            with suppress(ValueError):            # not the main thread
                old[sig] = signal.signal(sig, self._handler)
        try:
            yield
        finally:
            for sig, h in old.items():
                signal.signal(sig, h)


# ---- the end -------------------------------------------------------------------------------------
def finish(run: Run, world: D.World, stop_reason: str, final_eval: dict | None, command: str) -> dict:
    """Final HF folder, run card (md + json) and plot, on rank 0."""
    out = Path(run.cfg.out)
    if not world.main:
        export_model(run, world, out / "final")       # FSDP: every rank takes part in gathering
        return {}
    metrics, evals = read_jsonl(out / "metrics.jsonl"), read_jsonl(out / "eval.jsonl")
    card = pretrain_card(run, world, stop_reason, final_eval, command, metrics)
    export_model(run, world, out / "final")
    write_run_card(out, card)
    plot_curves(metrics, evals, out / "curves.png")
    log.info("run card: %s; curves: %s; model: %s", out / "run_card.md", out / "curves.png", out / "final")
    return card
