"""Pre-training's data as the loop reads it: the phases (short sequences, then optionally long
ones), each with the masking `prepare` recorded (the config's data.* keys over it) and the held-out
set, checked for leakage; and which instances each micro-batch of an update takes.

An update's instances are a pure function of (seed, phase, epoch, update): the order is a
permutation drawn from (seed, phase, epoch), and micro-batch g = j * world + rank of update k takes
instances [g B, (g+1) B) of the update's slice, so 1 process x 2 accumulation steps and 2 processes x
1 see the same sequences, and a resumed run continues where the checkpoint says.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from .. import distributed as D
from ..data.heldout import WARN_OVERLAP, choose_held_out, ngram_overlap
from ..data.masking import Collator, MaskingConfig, MaskingError, with_overrides
from ..data.pretraining import open_dataset
from ..runconfig import PretrainConfig, RunConfigError
from ..runstate import Phase, Run

log = logging.getLogger("bertkit")


def data_fill(phase: Phase, sample: int = 100_000) -> float | None:
    """Real tokens per position of the longest instance, over the first `sample` training instances
    of a phase (None for no data). Read from the shards' offsets only: what CPU 'auto' packing needs."""
    lengths = phase.data.lengths()[phase.indices[:sample]]
    return float(lengths.mean() / lengths.max()) if lengths.size and lengths.max() > 0 else None


def build_phases(cfg: PretrainConfig, world: D.World) -> tuple[list[Phase], Any]:
    """The run's phases (data.path, then data.long_path if given) with their collators and held-out
    set, and the data's tokenizer; train.nsp is turned off where the data or the objective has no NSP."""
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


# ---- an update's micro-batches -------------------------------------------------------------------
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
    return [{**ph.collator([ph.data[int(i)] for i in chosen[g * B:(g + 1) * B]], epoch=epoch), "_g": g}
            for g in range(world.rank, A * W, W)]                         # g = j * W + rank, j < A
