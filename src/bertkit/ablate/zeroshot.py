"""Zero-shot measures of each arm's pre-trained model, and their sections of the grid's report.

  * BLiMP (`arm_blimp`): accuracy on the grid's minimal pairs by pseudo-log-likelihood (a causal model:
    its log-likelihood; `bertkit.blimp`), with the Wilson 95% interval; the per-pair outcomes are kept
    (arms/NAME/blimp_correct.txt), so an arm is compared with the base on the same pairs: the paired
    difference and its 95% interval (`paired_difference`), far tighter than two separate intervals.
  * NSP's topic shortcut (`arm_nsp_shortcut`, the paper note's failure mode 3): on the held-out documents,
    how much of next-sentence prediction a topic-only baseline (tf-idf cosine of the two segments)
    solves, beside the arm's NSP head on next, other-document and same-document non-adjacent pairs.

Both are cached in the arm's folder by the model's weights and settings, so a resumed or re-reported
grid never scores a model twice.
"""
from __future__ import annotations

import logging
import math
import time
from pathlib import Path

from ..errors import DataError
from .config import AblateConfig, _key, _read_json, _write_json
from .measure import delta_cell, weights_id

log = logging.getLogger("bertkit")


def arm_blimp(cfg: AblateConfig, model: Path, d: Path) -> dict:
    """BLiMP accuracy of the arm's model, zero-shot (pseudo-log-likelihood, or a causal model's
    log-likelihood: `bertkit.blimp`), with its Wilson 95% interval. Cached in d/blimp.json by model and
    settings; the per-pair outcomes in d/blimp_correct.txt (one 0/1 per pair, in the file's order)."""
    from .. import blimp

    data = Path(cfg.data_dir) / cfg.blimp["data"]          # an absolute path stays as it is
    method, limit = cfg.blimp.get("method") or "auto", cfg.blimp.get("limit")
    key = _key({"model": str(model), "weights": weights_id(model), "data": str(data), "limit": limit,
                "method": method})
    cached = _read_json(d / "blimp.json") or {}
    if cached.get("key") == key and (d / "blimp_correct.txt").is_file():
        return cached["summary"]
    t0, c0 = time.time(), time.process_time()
    pairs = blimp.read_pairs([data], limit=limit)
    pred = blimp.load(model, threads=cfg.threads or None)
    method = blimp.method_for(pred, method)
    scored = blimp.score_pairs(pred, pairs, method)
    o = blimp.summarize(pairs, scored["good"], scored["bad"])
    (d / "blimp_correct.txt").write_text("".join("1" if c else "0" for c in o["correct"]) + "\n", encoding="utf-8")
    o = o["overall"]
    summary = {"accuracy": o["accuracy"], "low": o["ci95"][0], "high": o["ci95"][1], "pairs": o["pairs"],
               "ties": o["ties"], "paradigm_mean": o["paradigm_mean"], "method": method, "data": str(data),
               "limit": limit, "wall_s": round(time.time() - t0, 1), "cpu_s": round(time.process_time() - c0, 1)}
    _write_json(d / "blimp.json", {"key": key, "summary": summary})
    log.info("ablate: BLiMP %.3f [%.3f, %.3f] on %d pairs (%s)", o["accuracy"], *o["ci95"], len(pairs), method)
    return summary


def arm_nsp_shortcut(cfg: AblateConfig, shared, model: Path, d: Path) -> dict | None:
    """The paper note's failure mode 3 on the arm's held-out documents: how much of NSP a topic-only
    baseline (tf-idf cosine of the two segments) solves, and the arm's NSP head on next, other-document
    and same-document non-adjacent pairs (`bertkit.nsp_probe.nsp_shortcut`). None when the model has no
    NSP head (MLM only, left-to-right). Cached in d/nsp_shortcut.json by the model's weights."""
    from ..nsp_probe import NoNSPHead, nsp_shortcut

    heldout = shared.root / "corpus" / "heldout.txt"
    key = _key({"model": str(model), "weights": weights_id(model), "text": str(heldout), "anchors": 1000})
    cached = _read_json(d / "nsp_shortcut.json") or {}
    if cached.get("key") == key:
        return cached["summary"]
    try:
        r = nsp_shortcut(model, heldout, anchors=1000, seed=0,
                         max_length=int(cfg.prepare.get("max_length", 128)), threads=cfg.threads or None)
    except NoNSPHead:
        r = None                                   # no NSP head: nothing to measure (a broken file still fails)
    except DataError as e:                         # too little held-out text for one pair: said, not fatal
        log.warning("ablate: NSP shortcut not measured: %s", e)
        return None
    _write_json(d / "nsp_shortcut.json", {"key": key, "summary": r})
    if r:
        log.info("ablate: NSP shortcut: head on same-document pairs %.3f, topic AUC %.3f",
                 r["kinds"]["same_document"]["nsp_accuracy"], r["against_is_next"]["random_document"]["topic_auc"])
    return r


# ---- report sections --------------------------------------------------------------------------------
def paired_difference(a: str, b: str, z: float = 1.959964) -> tuple[float, float, float] | None:
    """(mean difference, 95% low, high) of two arms' per-pair outcomes ('0'/'1' strings, same pairs in
    the same order): the normal interval of the mean of a_i - b_i. None when they are not the same pairs."""
    if not a or len(a) != len(b):
        return None
    d = [int(x) - int(y) for x, y in zip(a, b)]
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) if n > 1 else 0.0
    return mean, mean - z * sd / math.sqrt(n), mean + z * sd / math.sqrt(n)


def unpaired_difference(a: dict, b: dict, z: float = 1.959964) -> tuple[float, float, float] | None:
    """(difference, 95% low, high) of two arms' BLiMP accuracies on the same number of pairs when
    their per-pair outcomes are not both at hand (an arm scored on another machine whose
    blimp_correct.txt was not kept): the normal interval of two independent proportions. It ignores
    that both read the same pairs, so it is wider than the paired one wherever two models agree on
    pairs more than chance would, as models scored on the same pairs do."""
    if not a.get("pairs") or a.get("pairs") != b.get("pairs"):
        return None
    n, p, q = a["pairs"], a["accuracy"], b["accuracy"]
    half = z * math.sqrt((p * (1 - p) + q * (1 - q)) / n)
    return p - q, p - q - half, p - q + half


def _outcomes(cfg: AblateConfig, name: str) -> str:
    p = Path(cfg.out) / "arms" / name / "blimp_correct.txt"
    return p.read_text(encoding="utf-8").strip() if p.is_file() else ""


def blimp_section(cfg: AblateConfig, states: list[dict]) -> list[str]:
    """BLiMP per arm with its interval, the paired difference from the base arm, and the BLiMP paper's
    models (mean over the same paradigms, all 1,000 pairs of each) as anchors."""
    from .. import blimp

    scored = [s for s in states if isinstance(s.get("blimp"), dict)]
    if not cfg.blimp or not scored:
        return []
    base = _outcomes(cfg, cfg.base_arm)
    base_blimp = next((s["blimp"] for s in scored if s["name"] == cfg.base_arm), {})
    one = scored[0]["blimp"]
    out = ["## BLiMP, zero-shot", "",
           f"{one['pairs']:,} minimal pairs ({Path(one['data']).name}"
           + (f", the first {one['limit']} of each paradigm" if one.get("limit") else "")
           + "): the grammatical sentence must score higher than the ungrammatical one (pseudo-log-likelihood, "
           "a left-to-right model its log-likelihood; a tie counts as wrong, chance 0.500). Δ: the arm minus "
           f"the base arm `{cfg.base_arm}` on the same pairs, with the paired 95% interval (* = excludes 0; "
           "'unpaired': one arm's per-pair outcomes were not kept, so the interval of two independent "
           "proportions, wider).", "",
           "| arm | method | BLiMP accuracy [95%] | Δ vs base [95%] | ties |", "|---|---|---:|---:|---:|"]
    for s in scored:
        b = s["blimp"]
        if s["name"] == cfg.base_arm:
            delta = "base"
        else:
            own, how = _outcomes(cfg, s["name"]), ""
            d = paired_difference(own, base)
            if d is None and not (own and base):           # outcomes not kept: unpaired, and said so
                d, how = unpaired_difference(b, base_blimp), " unpaired"
            delta = delta_cell(d) + (how if d else "")
        out.append(f"| {s['name']} | {b['method']} | {b['accuracy']:.3f} [{b['low']:.3f}, {b['high']:.3f}] | "
                   f"{delta} | {b.get('ties', 0)} |")
    try:
        ref = blimp.published()
    except Exception:  # noqa: BLE001 - the anchors are context; the table stands without them
        ref = {}
    if ref:
        means = {k: sum(r[k] for r in ref.values()) / len(ref) for k in blimp.PUBLISHED}
        out += ["", "The BLiMP paper's models, mean over its 67 paradigms (Warstadt et al. 2020): "
                + ", ".join(f"{name} {means[k] / (100 if means[k] > 1 else 1):.3f}"
                            for k, name in blimp.PUBLISHED.items()) + "."]
    return out + [""]


def nsp_section(states: list[dict]) -> list[str]:
    """The NSP head of each arm that has one against the topic-only baseline on the same held-out pairs."""
    rows = [s for s in states if isinstance(s.get("nsp_shortcut"), dict)]
    if not rows:
        return []
    r0 = rows[0]["nsp_shortcut"]
    out = ["## NSP's topic shortcut (failure mode 3)", "",
           f"{r0['anchors']:,} held-out A segments, each with its next segment (IsNext), a segment of another "
           "document, and a later segment of its own document at least "
           f"{r0['min_distance']} sentences on (same topic, not next). Topic baseline: tf-idf cosine of A and B, "
           "no model. A head that learnt topic, not coherence, separates IsNext from other documents and "
           "fails on same-document pairs.", "",
           "| arm | head acc: IsNext | other doc | same doc | AUC IsNext vs other doc: head / topic | "
           "AUC IsNext vs same doc: head / topic |", "|---|---:|---:|---:|---:|---:|"]
    for s in rows:
        r = s["nsp_shortcut"]
        k, a = r["kinds"], r["against_is_next"]
        out.append(f"| {s['name']} | " + " | ".join(f"{k[x]['nsp_accuracy']:.3f}" for x in
                                                   ("is_next", "random_document", "same_document"))
                   + " | " + " | ".join(f"{a[x]['nsp_auc']:.3f} / {a[x]['topic_auc']:.3f}"
                                        for x in ("random_document", "same_document")) + " |")
    return out + [""]
