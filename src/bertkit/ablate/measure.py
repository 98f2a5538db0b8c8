"""What `bertkit ablate` measures and how arms are matched, apart from running them (`bertkit.ablate`):

  * the pre-training budget of an arm: the same tokens, wall time, or training FLOPs as the base arm
    (`budget_of`); FLOPs are counted from the settings (`update_flops`, never timed), so the same
    grid gives the same updates on every machine;
  * held-out MLM accuracy under one protocol for every arm (`heldout_mlm`): at the positions shown
    as [MASK] (the headline: a model that learnt to copy the 10% of targets left visible gains
    nothing there) and over all targets (BERT's figure), with the unigram baseline (the share of the
    most common target token) beside them;
  * paired differences of two arms on the same examples (`paired_ratio_difference`: any metric that is
    a ratio of sums, with its cluster-robust 95% interval; `paired_mlm_difference`), and the report's
    cells of figures (`delta_cell`, `_fmt`, `_minutes`, `_tokens`);
  * which weights a model folder holds (`weights_id`: a finished arm is redone when they change);
  * fine-tuning's learning rate chosen on dev per arm x task (`choose_lr`) and the seeds that
    collapsed to one class (`collapse_of`).
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Sequence

from ..config import SHAPE, preset
from ..data.masking import Collator, MaskingConfig, num_to_predict
from ..data.prepare import PrepareConfig
from ..data.pretraining import open_dataset
from ..errors import BertkitError
from ..runconfig import PretrainConfig, from_dict, merge
from .config import AblateConfig, Arm, _read_json, _write_json


# ---- the budget -----------------------------------------------------------------------------------
def budget_of(cfg: AblateConfig, arm: Arm) -> dict:
    """The arm's budget: {match, steps, time}, the arm's keys over the grid's. Matching FLOPs, `steps`
    is computed: the base arm's updates x its FLOPs per update / this arm's (rounded, at least 1),
    with the counts behind it; an arm's own `steps` fixes its updates whatever it matches."""
    b = {"match": cfg.budget.match, "steps": cfg.budget.steps, "time": cfg.budget.time, **arm.budget}
    if b["match"] == "time" and not b.get("time"):
        raise BertkitError(f"arm {arm.name}: budget.match 'time' needs budget.time (e.g. 3m)")
    if b["match"] != "flops" or "steps" in arm.budget:
        return b
    base = next((a for a in cfg.arms if a.name == cfg.base_arm), Arm(name=cfg.base_arm))
    base_steps = int({"steps": cfg.budget.steps, **base.budget}["steps"])
    mine, ref = update_flops(cfg, arm), update_flops(cfg, base)
    b.update(steps=max(1, round(base_steps * ref / mine)), flops_per_update=mine, reference=base.name,
             reference_updates=base_steps, reference_flops=base_steps * ref)
    return b


def update_flops(cfg: AblateConfig, arm: Arm) -> float:
    """Training FLOPs of one pre-training update of the arm, counted from its settings: `runlog.step_flops`
    (3 x the forward: 2 x the encoder's matmul weights per token, attention 4 T^2 C L per sequence, the
    MLM head 2 (C^2 + C V) on each position it projects, the NSP head) on global batch x prepare's
    max_length token slots. The head projects what the objective predicts: masked LM only the selected
    positions (`num_to_predict` of a full sequence's maskable tokens: ~15%, capped), next-token every
    position but the last. V is the configured vocabulary size (the same for every arm)."""
    from ..runlog import step_flops

    prep = from_dict(PrepareConfig, merge(cfg.prepare, arm.prepare), f"arm {arm.name} prepare")
    pc = from_dict(PretrainConfig, merge(merge(cfg.pretrain, arm.pretrain), {"data": {"path": "<train>"}}),
                   f"arm {arm.name} pretrain")
    mc, t, T = pc.model, pc.train, prep.max_length
    shape = {k: getattr(mc, k) for k in SHAPE if getattr(mc, k) is not None}
    bert = preset(mc.preset, vocab_size=int(cfg.tokenizer.get("vocab_size", 8000)), **shape)
    clm = (t.objective or ("clm" if mc.causal else "mlm")) == "clm"
    masking = dataclasses.replace(prep.masking_config, **pc.data.masking_overrides())
    per_sequence = T - 1 if clm else num_to_predict(T - (3 if prep.nsp else 2), masking)
    B = t.batch_size * t.grad_accum
    return float(step_flops(bert, B * T, B, T, B * per_sequence, t.nsp and not clm))


def budget_info(cfg: AblateConfig, arm: Arm) -> dict | None:
    """What arm.json, the report and --dry-run show of the arm's pre-training budget (None: the arm
    does not pre-train): match, updates, the analytic FLOPs per update and in all, what it matched."""
    if arm.model_from is not None or not arm.pretrained:
        return None
    b = budget_of(cfg, arm)
    per = b.get("flops_per_update") or update_flops(cfg, arm)
    timed = b["match"] == "time"
    info = {"match": b["match"], "updates": None if timed else int(b["steps"]), "flops_per_update": per,
            "flops": None if timed else per * int(b["steps"])}
    if timed:
        info["time"] = b["time"]
    if b.get("reference"):
        info["matched_to"] = {"arm": b["reference"], "updates": b["reference_updates"],
                              "flops": b["reference_flops"]}
    return info


# ---- held-out MLM -----------------------------------------------------------------------------------
def heldout_mlm(cfg: AblateConfig, shared, model_dir: Path, arm_dir: Path | None = None) -> dict | None:
    """Held-out MLM accuracy under one protocol for every arm (`shared`: the grid's `ablate.Shared`):
    the base prepare's held-out documents, token masking of 15% with 80/10/10, the same positions
    (seeded) whatever the arm trained with.
    `accuracy_mask` counts the positions shown as [MASK] only; `accuracy` all targets (10% of them
    are shown unchanged, which an arm trained to copy them gets right for free). `unigram`: the most
    common target token and its share (all targets, and at [MASK]): the accuracy of always guessing it.
    None for a causal (left-to-right) model: it has no masked-LM objective. With `arm_dir` (the arm's folder),
    the per-sequence outcomes at [MASK] go to arm_dir/mlm_outcomes.json (`OUTCOMES`), so two arms are
    compared on the same positions (`paired_mlm_difference`)."""
    import numpy as np
    import torch

    from ..checkpoint import load_model

    raw = _read_json(model_dir / "config.json") or {}
    if raw.get("bertkit_causal") or raw.get("is_decoder"):
        return None
    _, heldout, _ = shared.prepared(cfg.prepare)
    data = open_dataset(heldout)
    n = min(len(data), cfg.mlm_eval_instances)
    idx = np.linspace(0, len(data) - 1, n).round().astype(int) if n else []
    cap = 10 * math.ceil(0.15 * int(data.meta.get("max_length", 128)) / 10)    # 20 at 128, 80 at 512
    collator = Collator(data, MaskingConfig(mode="token", mask_prob=0.15, max_predictions=cap,
                                            mask_token_fraction=0.8, random_token_fraction=0.1), seed=20190101)
    mask_id = collator.info.mask_id
    model = load_model(model_dir, head="masked_lm", random_init=False).eval()
    loss, right, targets, shown, rows = 0.0, [], [], [], []
    with torch.no_grad():
        for s in range(0, n, 64):
            batch = collator([data[int(i)] for i in idx[s:s + 64]], epoch=0)
            out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                        mlm_labels=batch["mlm_labels"])
            loss += float(out["mlm_loss"]) * out["mlm_targets"].numel()
            right.append(out["mlm_logits"].argmax(-1) == out["mlm_targets"])
            targets.append(out["mlm_targets"])      # in the labels' row-major order (model.select_masked)
            shown.append(batch["input_ids"][batch["mlm_labels"] != -100] == mask_id)
            rows.append((batch["mlm_labels"] != -100).nonzero()[:, 0] + s)      # the sequence of each target
    right, targets, shown, rows = (torch.cat(x) if x else torch.zeros(0, dtype=torch.long)
                                   for x in (right, targets, shown, rows))
    count, masked = len(targets), int(shown.sum())
    top = int(torch.bincount(targets).argmax()) if count else None
    token = data.tokenizer().convert_ids_to_tokens([top])[0] if top is not None else None
    if arm_dir is not None:
        _write_json(arm_dir / OUTCOMES, {"weights": weights_id(model_dir), "instances": n,
                                     "correct": torch.bincount(rows[shown & right], minlength=n).tolist(),
                                     "masked": torch.bincount(rows[shown], minlength=n).tolist()})
    return {"accuracy": int(right.sum()) / max(count, 1), "loss": loss / max(count, 1), "predictions": count,
            "accuracy_mask": int(right[shown].sum()) / max(masked, 1), "mask_predictions": masked,
            "unigram": {"token": token, "share": int((targets == top).sum()) / max(count, 1),
                        "share_mask": int((targets[shown] == top).sum()) / max(masked, 1)},
            "instances": n, "protocol": "token 15%, 80/10/10, fixed positions, base held-out documents"}


OUTCOMES = "mlm_outcomes.json"


def paired_mlm_difference(a: dict, b: dict, z: float = 1.959964) -> tuple[float, float, float] | None:
    """(accuracy at [MASK] of a minus b, 95% low, high) on the same positions (`heldout_mlm`'s outcomes of
    two arms). The positions of one sequence are not independent, so the interval is the cluster-robust
    one of a ratio estimator with sequences as clusters: d_i = correct_a,i - correct_b,i, m_i = [MASK]
    positions of sequence i, D = sum d_i / sum m_i, var D = n/(n-1) sum (d_i - D m_i)^2 / (sum m_i)^2
    (`paired_ratio_difference` with the same denominators). None when the two were not scored on the
    same positions."""
    if not a or not b or a.get("masked") is None or a.get("masked") != b.get("masked"):
        return None
    return paired_ratio_difference(a["correct"], a["masked"], b["correct"], b["masked"], z)


def paired_ratio_difference(a_num: Sequence[float], a_den: Sequence[float], b_num: Sequence[float],
                            b_den: Sequence[float], z: float = 1.959964) -> tuple[float, float, float] | None:
    """(R_a - R_b, 95% low, high) for two metrics that are ratios of sums over the same examples, R =
    sum num_i / sum den_i (accuracy: den 1; F1: `tasks.metrics.example_counts`), each example a cluster.
    The interval is the linearised (delta-method) cluster-robust one: influence_i = (a_i - R_a ad_i) /
    sum ad - (b_i - R_b bd_i) / sum bd, var = n/(n-1) sum influence_i^2; with every den 1 it is the plain
    paired interval of the mean of a_i - b_i. None for fewer than 2 examples, lists of different
    lengths (not the same examples) or a metric with nothing in its denominator."""
    n = len(a_num)
    if n < 2 or not len(a_den) == len(b_num) == len(b_den) == n:
        return None
    sa, sb = float(sum(a_den)), float(sum(b_den))
    if sa == 0 or sb == 0:
        return None
    ra, rb = sum(a_num) / sa, sum(b_num) / sb
    var = n / (n - 1) * sum(((x - ra * u) / sa - (y - rb * v) / sb) ** 2
                            for x, u, y, v in zip(a_num, a_den, b_num, b_den))
    diff, half = ra - rb, z * math.sqrt(var)
    return diff, diff - half, diff + half


def delta_cell(d: tuple[float, float, float] | None) -> str:
    """A report cell for a paired difference with its 95% interval, * when the interval excludes 0."""
    return "—" if d is None else f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]{' *' if d[1] > 0 or d[2] < 0 else ''}"


def _fmt(v: Any, spec: str = ".3f") -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _minutes(v: Any) -> str:
    return "—" if v is None else "0" if v == 0 else f"{v / 60:.1f} min"


def _tokens(v: Any) -> str:
    if not v:
        return "0"
    return f"{v / 1e6:.2f}M" if v >= 1e5 else f"{v / 1e3:.0f}k"


# ---- fine-tuning: the rate chosen on dev, collapsed seeds -------------------------------------------
def choose_lr(scores: dict[float, list[float | None]]) -> tuple[float, dict[float, float | None]]:
    """(the rate with the best dev mean, each candidate's mean): a run without a dev score counts as
    the worst; a tie goes to the rate listed first."""
    means = {lr: (sum(v) / len(v) if v and None not in v else None) for lr, v in scores.items()}
    best = max(means, key=lambda lr: -math.inf if means[lr] is None else means[lr])
    return best, means


def collapse_of(result: dict) -> dict:
    """{predicted, collapsed} of a fine-tuning run's last dev evaluation: how often each class (each
    tag) was predicted, and whether all predictions were one class (for tagging: no entity, all 'O')
    - a seed that fell to the majority class: `finetune --seeds`' rule (`finetune.seeds.one_answer`).
    None where the run did not record it."""
    from ..finetune.seeds import one_answer      # the fine-tuning package imports torch: ablate --help stays light

    metric = result.get("main_metric")
    history = [h for h in result.get("history") or [] if f"dev_{metric}" in h]     # the reported one: the last
    counts = history[-1].get("dev_predicted") if history else None
    if not isinstance(counts, dict):
        return {"predicted": None, "collapsed": None}
    return {"predicted": counts, "collapsed": one_answer(counts)}


# ---- which weights a model folder holds ---------------------------------------------------------------
def weights_id(model: Path) -> list:
    """Names, sizes and modification times of a model's weight files: changes when it is trained again."""
    return sorted([p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in Path(model).glob("*.safetensors"))
