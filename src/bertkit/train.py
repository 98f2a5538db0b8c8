"""Pre-training with MLM (+ NSP): an explicit loop you can read top to bottom.

Why one file: setup, the update and evaluation share the run state (`runstate.Run`, a dataclass;
`runstate.State` is the part a checkpoint saves) and read best together; the run card is assembled
in runlog.py, checkpoints and the loop's state in runstate.py.

    setup()      model, optimizer, data, device, precision; resume from the latest valid checkpoint
    train_step() one update: micro-batches (gradient accumulation), clipping, a non-finite guard
    evaluate()   MLM loss / accuracy / perplexity and NSP accuracy on a held-out slice
    save_checkpoint() / find_checkpoint()   atomic, last K kept, HF model folder inside

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
from contextlib import nullcontext
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from . import distributed as D
from .checkpoint import build, load_model
from .config import preset
from .hardware import PRECISION_NAMES, attention_kernel, choose_precision
from .model import init_weights, neighbour_attention_, num_parameters, set_attention_kernel, sinusoidal_positions_
from .packing import pack, varlen_runs
from .optim import build_optimizer, lr_at
from .runconfig import ModelSection, PretrainConfig, RunConfigError, parse_duration, save_config
from .runlog import (MetricsLog, Window, bar_update, plot_curves, pretrain_card, progress_bar, read_jsonl,
                     step_flops, tensorboard_writer, write_run_card)
from .runstate import Phase, Run, State, Step, export_model, find_checkpoint, load_checkpoint, save_checkpoint, saved_state

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

    @classmethod
    def size(cls) -> int:
        return len(fields(cls))


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


def pretrain(cfg: PretrainConfig, command: str = "", on_step: Callable[[State], None] | None = None) -> dict:
    """Run pre-training as configured; returns the run card (also written to `cfg.out`).

    `on_step(state)`, if given, is called right after each update (before it is logged, evaluated
    or checkpointed) with the loop state (`runstate.State`: step, tokens, elapsed, ...); it should
    only read it. A test of crash recovery, for one, kills the process there."""
    world = D.init()
    threads = torch.get_num_threads()
    try:
        return _pretrain(cfg, world, command, on_step)
    finally:
        torch.set_num_threads(threads)
        D.teardown()


def _pretrain(cfg: PretrainConfig, world: D.World, command: str, on_step: Callable[[State], None] | None) -> dict:
    run = setup(cfg, world)
    try:
        return _loop(run, command, on_step)
    finally:
        run.pool.shutdown(wait=True, cancel_futures=True)


def _loop(run: Run, command: str, on_step: Callable[[State], None] | None) -> dict:
    cfg, world = run.cfg, run.world
    out, st, tc = Path(cfg.out), run.state, cfg.train
    stop = _StopFlag()
    metrics = MetricsLog(out / "metrics.jsonl", keep_until_step=st.step if run.resumed else None) if world.main else None
    evals = MetricsLog(out / "eval.jsonl", keep_until_step=st.step if run.resumed else None) if world.main else None
    board = tensorboard_writer(out) if tc.tensorboard and world.main else None
    if not run.resumed:
        _eval_and_log(run, evals, board, None)          # the untrained model, for "before / after"
    if run.budget and not st.planned_steps:
        st.planned_steps = plan_budget(run)
    total = total_steps(run)
    bar = progress_bar(cfg, st, world, total)
    window = Window()
    start, last_ckpt = time.perf_counter() - st.elapsed, time.perf_counter()
    stop_reason = "max_steps" if total == tc.max_steps else f"budget: {total} updates planned"
    with stop.installed():
        while True:
            if st.step >= total:
                break
            _maybe_switch_phase(run)
            s = train_step(run)
            if on_step is not None:
                on_step(st)
            st.elapsed = D.all_reduce_sum(torch.tensor([time.perf_counter() - start], dtype=torch.float64,
                                                       device=world.device), world).item() / world.world_size
            window.add(s)
            if bar is not None:
                bar_update(bar, run, s)
            if st.bad_steps >= tc.max_bad_steps:
                stop_reason = f"{st.bad_steps} non-finite losses in a row"
                log.error("stopping: %s (lower optim.lr or use fp32/bf16); a checkpoint is saved", stop_reason)
                break
            if st.step % tc.log_every == 0 and world.main:
                rec = window.record(st, run)
                metrics.write(rec)
                if board is not None:
                    for k, v in rec.items():
                        if isinstance(v, (int, float)) and k != "step" and v is not None:
                            board.add_scalar(f"train/{k}", v, st.step)
            if tc.log_every and st.step % tc.log_every == 0:
                window = Window()
            if (tc.eval_every and st.step % tc.eval_every == 0) or \
                    (tc.eval_minutes and st.elapsed - run.last_eval_elapsed >= 60 * tc.eval_minutes):
                start += _timed_eval(run, evals, board, bar)      # evaluation time is not training time
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
    final_eval = last if last is not None and last.get("step") == st.step else _eval_and_log(run, evals, board, None)
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
    phases, tokenizer = _phases(cfg, world)
    ckpt = find_checkpoint(out / "checkpoints") if cfg.resume else None
    if cfg.resume and ckpt is None:
        log.warning("--resume: no valid checkpoint in %s; starting from scratch", out / "checkpoints")
    model = _build_model(cfg, tokenizer.vocab_size, ckpt, world).to(world.device)   # (init_from: cfg.model says what it is)
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
    choices, reasons, changes = machine_choices(cfg, world, model, phases, ckpt)
    precision, precision_reason = reasons["precision"]
    packed, packed_reason = reasons["packed"]
    kernel, kernel_reason = reasons["attention_kernel"]
    set_attention_kernel(model, kernel)
    model.config.extra["bertkit_run"] = dict(choices)     # config.json of every checkpoint and final/ says it
    said = model.config.extra.get("bertkit_trained_length")    # (an init_from model's own)
    model.config.extra["bertkit_trained_length"] = max(longest, said if isinstance(said, int) else 0)
    wrapped = D.parallelize(model, world, tc.distributed, tc.compile)
    # torch's fused AdamW: the same update in one pass over the weights (timed in docs/pretrain.md);
    # not under FSDP, whose sharded parameters take the per-tensor loop
    optimizer = build_optimizer(model, cfg.optim.name, cfg.optim.lr, cfg.optim.weight_decay,
                                cfg.optim.betas, cfg.optim.eps,
                                fused=cfg.optim.name == "adamw" and not (world.distributed and tc.distributed == "fsdp"))
    scaler = torch.amp.GradScaler("cuda") if precision == torch.float16 else None
    state = State()
    run = Run(cfg=cfg, world=world, model=model, wrapped=wrapped, optimizer=optimizer, scaler=scaler,
              state=state, phases=phases, tokenizer=tokenizer, precision=precision,
              precision_reason=precision_reason, packed=packed, packed_reason=packed_reason,
              attention_kernel=kernel, attention_kernel_reason=kernel_reason,
              budget=budget, resumed=ckpt is not None, eval_batches=_eval_batches(cfg, phases[0], world),
              pool=ThreadPoolExecutor(1, thread_name_prefix="bertkit-data"))
    if ckpt is not None:
        load_checkpoint(run, ckpt, world)
        log.info("resumed from %s (update %d)", ckpt, state.step)
    state.choices = dict(choices)
    state.changes += [[state.step, *c] for c in changes]
    if world.main:
        log.info("model %s: %s parameters, vocab %d; global batch %d (%d per device x %d accumulation x %d "
                 "processes); %s, %s path, %s", cfg.model.preset, f"{num_parameters(model):,}", tokenizer.vocab_size,
                 phases[0].batch_size * phases[0].grad_accum * world.world_size, phases[0].batch_size,
                 phases[0].grad_accum, world.world_size, str(precision).replace("torch.", ""),
                 "packed" if packed else "padded", world.device)
    return run


def machine_choices(cfg: PretrainConfig, world: D.World, model, phases: list[Phase],
                    ckpt: Path | None) -> tuple[dict, dict, list]:
    """Precision, attention kernel and padded/padding-free: each made once, at the start of a run.
    'auto' takes what the run being resumed (or the model.init_from model, on the same kind of device)
    ran with, as its checkpoint records it; else it is decided for this machine, by a measurement
    that is itself made once per machine (`hardware.measured_once`). So a rerun, a resume and a
    continued run compute as the first run did. Returns (choices, {key: (value, reason)}, changes),
    `changes` being (key, before, after) where an explicit setting overrides a resumed run's."""
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
    reasons = {"precision": (precision, said.get("precision", why)), "packed": (packed, said.get("packed", packed_why)),
               "attention_kernel": (kernel, said.get("attention_kernel", kernel_why))}
    choices = {"device": world.device.type, "precision": PRECISION_NAMES[precision], "attention_kernel": kernel,
               "packed": packed}
    return choices, reasons, changes


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
    pace = float(np.median(times[1:]))                      # the first update pays one-time set-up
    pace = D.all_reduce_sum(torch.tensor([pace], dtype=torch.float64, device=world.device), world).item() \
        / world.world_size
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
    why_not = varlen_runs(device, precision, model_cfg.attention_dropout)
    if why_not is not None:
        return False, f"auto: padded ({why_not})"
    return True, "auto: packed (varlen flash attention)"


def data_fill(phase: "Phase", sample: int = 100_000) -> float | None:
    """Real tokens per position of the longest instance, over the first `sample` training instances
    of a phase (None for no data). Read from the shards' offsets only: what CPU 'auto' packing needs."""
    lengths = phase.data.lengths()[phase.indices[:sample]]
    return float(lengths.mean() / lengths.max()) if lengths.size and lengths.max() > 0 else None


def _phases(cfg: PretrainConfig, world: D.World) -> tuple[list[Phase], Any]:
    from .data.heldout import choose_held_out
    from .data.masking import Collator
    from .data.pretraining import open_dataset

    tc, dc = cfg.train, cfg.data
    if not dc.path:
        raise RunConfigError("data.path is not set: give the folder written by `bertkit prepare` "
                             "(--data.path=DIR)")
    first = open_dataset(dc.path)
    tokenizer = first.tokenizer()
    if tc.nsp and tc.objective == "clm":
        log.info("train.objective=clm: no NSP head (the paper's LTR & No NSP baseline; train.nsp=false)")
        tc.nsp = False
    if tc.nsp and not first.meta.get("nsp", True):
        log.warning("%s was prepared without NSP pairs: training MLM only (train.nsp=false)", dc.path)
        tc.nsp = False
    if tc.objective == "clm" and dc.masking_overrides():
        raise RunConfigError(f"train.objective=clm masks nothing: drop the data.* masking keys "
                             f"({', '.join(dc.masking_overrides())})")
    if tc.objective == "clm" and first.meta.get("nsp"):
        log.info("%s holds NSP pairs: half of the B segments come from another document (prepare --no-nsp for "
                 "contiguous text)", dc.path)
    held = choose_held_out(first, dc.eval_path, dc.eval_instances)
    phases = [Phase("short", dc.path, first, None, np.arange(held.train_stop), tc.batch_size, tc.grad_accum,
                    int(first.meta.get("max_length", 0)), held)]
    if dc.long_path:
        long = open_dataset(dc.long_path)
        if long.tokenizer().fingerprint() != tokenizer.fingerprint():
            raise RunConfigError(f"data.long_path {dc.long_path} was prepared with another vocabulary than data.path")
        lb = tc.long_batch_size or max(1, tc.batch_size // 4)
        if (tc.batch_size * tc.grad_accum) % lb:
            raise RunConfigError(f"train.long_batch_size {lb} must divide batch_size x grad_accum "
                                 f"({tc.batch_size * tc.grad_accum}) so the global batch stays the same")
        phases.append(Phase("long", dc.long_path, long, None, np.arange(len(long)), lb,
                            tc.batch_size * tc.grad_accum // lb, int(long.meta.get("max_length", 0))))
    for i, ph in enumerate(phases):
        ph.collator = Collator(ph.data, _masking(ph, dc.masking_overrides(long=i == 1), i == 1), seed=tc.seed,
                               objective=tc.objective)
        G = ph.batch_size * ph.grad_accum * world.world_size
        if len(ph.indices) < G:
            raise RunConfigError(f"{ph.path}: {len(ph.indices)} training instances, fewer than one global batch "
                                 f"({G}); lower train.batch_size or prepare more data")
    _check_held_out(held, phases, dc.max_eval_overlap)
    return phases, tokenizer


def _check_held_out(held, phases: list[Phase], limit: float) -> None:
    """Measure how much of the held-out text the training data holds ("mask leakage"): a held-out
    set over `data.max_eval_overlap` is refused, over 5% warned about; data prepared without a
    held-out split falls back on its last instances with a loud warning (and the figure)."""
    from .data.heldout import WARN_OVERLAP, ngram_overlap

    held.report.update(ngram_overlap(held, [(p.data, len(p.data) if i else held.train_stop)
                                            for i, p in enumerate(phases)]))
    share, src = held.report.get("overlap"), held.report.get("path")
    if share is None:
        return
    said = f"{share:.1%} of the held-out set's 12-grams also occur in the training data"
    if held.source == "last_instances":
        log.warning("NO HELD-OUT DOCUMENTS: %s was prepared without an evaluation split, so evaluation uses its last "
                    "%d instances, which share documents with training: %s (mask leakage). Prepare again (it holds "
                    "out 1%% of the documents by default) or set data.eval_path", src, len(held.indices), said)
    elif share > limit:
        raise RunConfigError(f"held-out set {src} ({held.source}): {said} (mask leakage: the evaluation would "
                             "reward memorised text). Hold out other documents (bertkit prepare --eval-fraction F) "
                             f"or set data.eval_path; data.max_eval_overlap={limit} is the limit (1 accepts it)")
    elif share > WARN_OVERLAP:
        log.warning("held-out set %s: %s (mask leakage: held-out scores will be optimistic)", src, said)
    else:
        log.info("held-out set %s (%s, %d instances): %s", src, held.source, len(held.indices), said)


def _masking(ph: Phase, overrides: dict, long: bool):
    """Exactly the masking `prepare` recorded for the phase's data, with the config's data.* keys
    over it (dynamic masking only: static data carries its masks, so an override is an error)."""
    from .data.masking import MaskingConfig, MaskingError, with_overrides

    key = {"mode": "data.mask_mode", "max_predictions": "data.long_max_predictions" if long else "data.max_predictions"}
    prepared = MaskingConfig(**ph.data.meta.get("masking_config", {}))
    try:
        masking, changed = with_overrides(prepared, overrides)
    except MaskingError as e:
        raise RunConfigError(f"data.* masking keys over {ph.path}'s prepared masking: {e}") from None
    names = ", ".join(f"{key.get(k, 'data.' + k)}={v['trained']} (prepared: {v['prepared']})" for k, v in changed.items())
    if changed and ph.data.static:
        raise RunConfigError(f"{ph.path} was prepared with static masks, which training uses as stored: {names} "
                             "cannot apply (prepare with --masking dynamic, or drop these keys)")
    if changed:
        log.info("%s: masking overridden by the config: %s", ph.path, names)
    want = round((ph.max_len - 3) * masking.mask_prob)      # what the probability selects in a full sequence
    if not ph.data.static and masking.max_predictions < 0.9 * want:
        log.warning("%s: the cap of %d predictions per sequence binds: %.0f%% of %d tokens would select %d "
                    "(set %s, or prepare with --masking_config.max_predictions)", ph.path, masking.max_predictions,
                    100 * masking.mask_prob, ph.max_len, want, key["max_predictions"])
    return masking


def _or(value, default):
    return default if value is None else value


def _continued_model(cfg: PretrainConfig, vocab_size: int, head_args: dict):
    """model.init_from's model: its own architecture (a model key that says otherwise is refused,
    naming it), the dropout and pooling asked for applied, and cfg.model rewritten to what it is,
    so config.yaml and the run card say what trained."""
    from .config import PRESETS

    mc, defaults = cfg.model, ModelSection()
    changes = {k: getattr(mc, k) for k in ("hidden_dropout", "attention_dropout", "classifier_pooling")
               if getattr(mc, k) is not None}
    model = load_model(mc.init_from, head="pretraining", new_head_ok=True, config_changes=changes or None, **head_args)
    have = model.config
    if have.vocab_size != vocab_size:
        raise RunConfigError(f"model.init_from {mc.init_from} has vocab_size {have.vocab_size}, "
                             f"the data's tokenizer {vocab_size}")
    shape = {k: getattr(have, k) for k in ("num_layers", "hidden_size", "num_heads", "intermediate_size")}
    asked = {k: getattr(mc, k) for k in shape if getattr(mc, k) is not None}
    if mc.preset != defaults.preset:
        asked = {**PRESETS[mc.preset], **asked}
    asked.update({k: getattr(mc, k) for k in ("hidden_act", "norm_position", "max_position_embeddings",
                                               "position_embedding_type") if getattr(mc, k) != getattr(defaults, k)})
    wrong = [f"model.{k}={v!r} (it has {getattr(have, k)!r})" for k, v in asked.items() if getattr(have, k) != v]
    if wrong:
        raise RunConfigError(f"model.init_from {mc.init_from} brings its own architecture: " + ", ".join(wrong)
                             + " (drop the key, or start a new model)")
    for k in (*shape, "hidden_act", "norm_position", "max_position_embeddings", "position_embedding_type",
              "hidden_dropout", "attention_dropout", "classifier_pooling"):
        setattr(mc, k, getattr(have, k))
    mc.preset = next((name for name, p in PRESETS.items() if p == shape), mc.preset)
    return model


def _build_model(cfg: PretrainConfig, vocab_size: int, ckpt: Path | None, world: D.World | None = None):
    mc = cfg.model
    head_args = {"nsp": cfg.train.nsp}
    if ckpt is not None:                     # weights come from the checkpoint's HF folder
        return _attention(load_model(ckpt / "model", head="pretraining", **head_args), mc.causal)
    if mc.init_from:
        return _attention(_continued_model(cfg, vocab_size, head_args), mc.causal)
    overrides = {k: getattr(mc, k) for k in ("num_layers", "hidden_size", "num_heads", "intermediate_size")
                 if getattr(mc, k) is not None}
    bert_cfg = preset(mc.preset, vocab_size=vocab_size, max_position_embeddings=mc.max_position_embeddings,
                      hidden_act=mc.hidden_act, hidden_dropout=_or(mc.hidden_dropout, 0.1),
                      attention_dropout=_or(mc.attention_dropout, 0.1), norm_position=mc.norm_position, causal=mc.causal,
                      position_embedding_type=mc.position_embedding_type,
                      classifier_pooling=mc.classifier_pooling or "cls", **overrides)
    if world is not None:
        check_memory(bert_cfg, head_args, world, cfg.train.distributed == "fsdp")
    torch.manual_seed(cfg.train.seed)
    model = init_weights(build("pretraining", bert_cfg, **head_args), bert_cfg)
    if mc.position_init == "sinusoidal":
        sinusoidal_positions_(model.bert.embeddings.position.weight, bert_cfg.initializer_range)
    if mc.attention_init == "neighbours":
        neighbour_attention_(model.bert)
    return model


def check_memory(bert_cfg, head_args: dict, world: D.World, sharded: bool = False) -> None:
    """A new model whose weights, gradients and AdamW's two moments (16 bytes a parameter; FSDP: shared
    over the processes) do not fit in the device's free memory is refused before it is allocated: a
    config asking for 800 GB is one line, not minutes of swapping until the kernel kills the run."""
    n = parameter_count(bert_cfg, head_args)
    need, free = 16 * n / (world.world_size if sharded else 1), _free_memory(world.device)
    if free is not None and need > free:
        raise RunConfigError(f"the model has {n / 1e9:,.2f} B parameters: ~{need / 2 ** 30:,.1f} GiB for its weights, "
                             f"gradients and AdamW moments, more than the {free / 2 ** 30:,.1f} GiB free on "
                             f"{world.device.type}; choose a smaller model.preset or model.* shape")


def parameter_count(bert_cfg, head_args: dict) -> int:
    """The parameters of the pre-training model `bert_cfg` describes, counted without allocating them."""
    with torch.device("meta"):          # shapes only; every block is the same size: count one, two
        one, two = (num_parameters(build("pretraining", bert_cfg.replace(num_layers=k), **head_args)) for k in (1, 2))
    return one + (bert_cfg.num_layers - 1) * (two - one)


def _free_memory(device: torch.device) -> int | None:
    """Bytes free for a new model on `device` (a GPU: what CUDA reports; the CPU: MemAvailable), None
    where unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def _attention(model, causal: bool):
    """The attention direction the config asks for (model.causal / train.objective), also on a loaded
    model; config.json records it (bertkit_causal), so fine-tuning the checkpoint keeps it."""
    if bool(model.config.causal) != bool(causal):
        log.info("attention switched to %s for this run", "causal" if causal else "bidirectional")
        model.config.causal = bool(causal)
        for m in model.modules():
            if hasattr(m, "causal"):
                m.causal = bool(causal)
    return model


# ---- one update ----------------------------------------------------------------------------------
def forward(model, batch: dict, packed: bool) -> dict:
    """The model on one micro-batch, padded or padding-free (numerically the same)."""
    if packed:
        flat, layout = pack(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                            labels=batch["mlm_labels"])
        return model(flat["input_ids"], flat["token_type_ids"], None, mlm_labels=flat["labels"],
                     nsp_labels=batch.get("nsp_labels"), packed=layout, position_ids=flat["position_ids"])
    return model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                 mlm_labels=batch["mlm_labels"], nsp_labels=batch.get("nsp_labels"))


def micro_batches(run: Run) -> list[dict]:
    """This rank's micro-batches of the next update, and advance the data position.

    The batches of the following update are collated in a background thread meanwhile (they
    depend only on the position, so this changes no number)."""
    st, world = run.state, run.world
    p = st.phase
    st.epoch[p], st.offset[p] = _roll(run, p, st.epoch[p], st.offset[p])
    key = (p, st.epoch[p], st.offset[p])
    ahead = run.prefetch
    batches = ahead[1].result() if ahead and ahead[0] == key else _collate(run, *key)
    following = (p, *_roll(run, p, key[1], key[2] + 1))
    run.prefetch = (following, run.pool.submit(_collate, run, *following))
    st.offset[p] += 1
    return [{k: (v.to(world.device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in b.items()}
            for b in batches]


def _roll(run: Run, phase: int, epoch: int, offset: int) -> tuple[int, int]:
    """(epoch, update within epoch), moving to the next epoch when this one has no full global batch left."""
    ph = run.phases[phase]
    per_epoch = len(ph.indices) // (ph.batch_size * ph.grad_accum * run.world.world_size)
    return (epoch + 1, 0) if offset >= per_epoch else (epoch, offset)


def _collate(run: Run, phase: int, epoch: int, k: int) -> list[dict]:
    """Micro-batch g = j * world + rank of update k takes instances [g B, (g+1) B) of its slice."""
    ph, world = run.phases[phase], run.world
    B, A, W = ph.batch_size, ph.grad_accum, world.world_size
    G = B * A * W
    orders = run.orders
    if (phase, epoch) not in orders:
        orders.clear()
        rng = np.random.default_rng([run.cfg.train.seed, phase, epoch])
        orders[(phase, epoch)] = ph.indices[rng.permutation(len(ph.indices))]
    chosen = orders[(phase, epoch)][k * G:(k + 1) * G]
    batches = []
    for j in range(A):
        g = j * W + world.rank
        batch = ph.collator([ph.data[int(i)] for i in chosen[g * B:(g + 1) * B]], epoch=epoch)
        batch["_g"] = g
        batches.append(batch)
    return batches


def train_step(run: Run) -> Step:
    """One optimizer update over grad_accum micro-batches on every rank; returns global statistics."""
    cfg, st, world = run.cfg, run.state, run.world
    model, wrapped, opt, scaler = run.model, run.wrapped, run.optimizer, run.scaler
    model.train()
    batches = micro_batches(run)
    A = len(batches)
    acc = torch.zeros(StepSums.size(), dtype=torch.float64, device=world.device)   # StepSums' fields, in order
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
    cfg, st = run.cfg, run.state
    oc = cfg.optim
    total = total_steps(run)
    warm = oc.warmup * total if oc.warmup < 1 else oc.warmup
    return lr_at(st.step, total, warm, oc.lr, oc.schedule, oc.end_lr, oc.decay_fraction)


def _maybe_switch_phase(run: Run) -> None:
    cfg, st = run.cfg, run.state
    if len(run.phases) < 2 or st.phase == 1:
        return
    tc = cfg.train
    progress = st.step / total_steps(run)
    if progress >= 1 - tc.long_fraction:
        st.phase = 1
        log.info("update %d: phase 2 (long sequences, %s)", st.step, run.phases[1].path)


# ---- evaluation ----------------------------------------------------------------------------------
def _eval_batches(cfg: PretrainConfig, phase: Phase, world: D.World) -> list[dict]:
    """The held-out set (`phase.held_out`), masked once (seed + 1, epoch 0) as training masks, split across ranks."""
    from .data.masking import Collator

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


def _timed_eval(run: Run, evals, board, bar) -> float:
    """Evaluate and log; returns the seconds it took (the loop takes them off its training clock)."""
    t = time.perf_counter()
    _eval_and_log(run, evals, board, bar)
    run.last_eval_elapsed = run.state.elapsed
    return time.perf_counter() - t


def _eval_and_log(run: Run, evals, board, bar) -> dict | None:
    rec = evaluate(run)
    if rec is not None:      # where on the training clock the point lies: curves against time or tokens
        rec.update(elapsed_s=round(run.state.elapsed, 3), tokens=run.state.tokens)
    run.last_eval = rec
    if rec and run.world.main:
        evals.write(rec)
        if board is not None:
            for k, v in rec.items():
                if v is not None and k != "step":
                    board.add_scalar(f"eval/{k[5:]}", v, rec["step"])
        lm = ("next-token", "eval_next_token") if "eval_next_token_loss" in rec else ("MLM", "eval_mlm")
        msg = (f"update {rec['step']}: held-out {lm[0]} loss {rec[lm[1] + '_loss']:.4f}, accuracy "
               f"{rec[lm[1] + '_accuracy']:.4f}"
               + (f" (at [MASK] {rec['eval_mask_accuracy']:.4f})" if "eval_mask_accuracy" in rec else "")
               + ", perplexity "
               f"{rec.get('eval_perplexity', rec.get('eval_next_token_perplexity')):.1f}"
               + (f", NSP accuracy {rec['eval_nsp_accuracy']:.4f}" if rec["eval_nsp_accuracy"] is not None else ""))
        (bar.write(msg) if bar is not None else log.info(msg))
    return rec


class _StopFlag:
    """SIGTERM / SIGINT set a flag; the loop saves a checkpoint at the end of the current update."""

    def __init__(self):
        self.signum = None

    def _handler(self, signum, frame):
        if self.signum is not None:               # a second Ctrl-C: stop at once
            raise KeyboardInterrupt
        self.signum = signum

    def installed(self):
        flag = self

        class _Ctx:
            def __enter__(self_):
                self_.old = {}
                for sig in (signal.SIGTERM, signal.SIGINT):
                    try:
                        self_.old[sig] = signal.signal(sig, flag._handler)
                    except ValueError:            # not the main thread
                        pass

            def __exit__(self_, *exc):
                for sig, h in self_.old.items():
                    signal.signal(sig, h)
                return False
        return _Ctx()


# ---- the end -------------------------------------------------------------------------------------
def finish(run: Run, world: D.World, stop_reason: str, final_eval: dict | None, command: str) -> dict:
    """Final HF folder, run card (md + json) and plot, on rank 0."""
    cfg = run.cfg
    out = Path(cfg.out)
    if not world.main:
        export_model(run, world, out / "final")       # FSDP: every rank takes part in gathering
        return {}
    metrics = read_jsonl(out / "metrics.jsonl")
    evals = read_jsonl(out / "eval.jsonl")
    card = pretrain_card(run, world, stop_reason, final_eval, command, metrics)
    export_model(run, world, out / "final")
    write_run_card(out, card)
    plot_curves(metrics, evals, out / "curves.png")
    log.info("run card: %s; curves: %s; model: %s", out / "run_card.md", out / "curves.png", out / "final")
    return card
