"""What ran, from each arm's run cards (`bertkit.ablate`'s report): the as-trained table (objective,
attention, norm, masking, shape, batch, held-out overlap, precision, fine-tuning mode) and the paper
note's reproduction checklist answered from the base arm's cards. The setting column of the main
table is what was asked; these sections are what the computation recorded it used."""
from __future__ import annotations

from pathlib import Path

from ..data.pretraining import open_dataset
from .arm import finetune_dir
from .config import AblateConfig, _read_json
from .measure import _fmt
from .shared import Shared


def _cards(cfg: AblateConfig, st: dict) -> tuple[dict, dict, dict]:
    """(pre-training run card, one fine-tuning run card, its metrics.json) of an arm ({} where none)."""
    pre = st.get("pretrain") or {}
    card = _read_json(Path(pre["run_card"]).with_suffix(".json")) if pre.get("run_card") else None
    task = next(iter(cfg.tasks), None)
    ft = finetune_dir(Path(cfg.out) / "arms" / st["name"], str(task), cfg.seeds[0], (st.get("lr_chosen") or {}).get(task))
    return card or {}, _read_json(ft / "run_card.json") or {}, _read_json(ft / "metrics.json") or {}


def _objective(card: dict) -> str:
    """The run card's objective; pairs prepared for sentence-order prediction say so (the NSP head
    is trained on their labels)."""
    obj = card.get("objective") or "—"
    data = card.get("data") or []
    meta = _read_json(Path(data[0]) / "meta.json") if data else None
    if meta and (meta.get("config") or {}).get("pair_mode") == "sop":
        obj = obj.replace("NSP", "SOP (sentence order, NSP head)")
    return obj


def _masking(card: dict) -> str:
    if str(card.get("objective", "")).startswith("CLM"):
        return "none (next-token)"
    phases = card.get("masking") or []
    m = phases[0].get("as_trained") if phases and isinstance(phases, list) else None
    if not m:
        return "—"
    mask, rand = m.get("mask_token_fraction", 0), m.get("random_token_fraction", 0)
    text = (f"{m.get('mode')} {100 * m.get('mask_prob', 0):.0f}%, "
            f"{100 * mask:.0f}/{abs(100 * (1 - mask - rand)):.0f}/{100 * rand:.0f}")   # abs: 1 - 0.8 - 0.2 < 0
    return text + (" (override)" if phases[0].get("overridden") else "")


def as_trained_section(cfg: AblateConfig, states: list[dict]) -> list[str]:
    """One row per finished arm with what its run cards say ran: the check that each setting reached
    the computation (the 'setting' column above is what was asked)."""
    out = ["## As trained (from each arm's run cards)", "",
           "| arm | objective | attention | norm | masking as trained: mode rate, MASK/SAME/RND (the paper's order) | model | "
           "batch x length, updates | held-out 12-gram overlap | precision | fine-tuning |",
           "|---|---|---|---|---|---|---|---:|---|---|"]
    for st in states:
        if st.get("status") not in ("done", "pretrained"):
            continue
        card, ft, _ = _cards(cfg, st)
        model = (card.get("config") or {}).get("model") or {}
        params = card.get("parameters") or ft.get("parameters")
        pre = st.get("pretrain") or {}
        held = card.get("held_out") or {}
        updates = pre.get("updates") if pre.get("checkpoint") else card.get("updates")
        if card:
            run = f"{card.get('global_batch')} x {(card.get('sequence_lengths') or ['?'])[0]}, {updates}"
        elif pre.get("updates"):            # an arm whose run cards are not here (copied from a committed result)
            run = f"{pre.get('global_batch', '?')} x {(pre.get('sequence_lengths') or ['?'])[0]}, {pre['updates']} (arm.json)"
        else:
            run = "no pre-training"
        probe = ft.get("probe")
        if isinstance(probe, dict):
            probe = f"{probe.get('features')}" + (f" ({probe['pooling']})" if probe.get("pooling") else "")
        tune = f"frozen probe: {probe}" if probe and probe != "None" else (ft.get("mode") or "—")
        out.append(f"| {st['name']} | {_objective(card)} | {card.get('attention') or ft.get('attention', '—')} | "
                   f"{ft.get('normalization') or model.get('norm_position', '—')} | {_masking(card)} | {_shape(st, ft)}"
                   f"{f', {params / 1e6:.2f}M' if params else ''} | {run} | "
                   f"{_fmt(held.get('overlap'), '.4f')} | {card.get('precision') or pre.get('precision') or '—'} | {tune} |")
    return out


def _shape(st: dict, ft: dict) -> str:
    """'L4/H256/A4' from the arm's model folder (config.json: what was built, a preset resolved), else
    from its fine-tuning metrics; '—' when neither is there."""
    raw = (_read_json(Path(st["model"]) / "config.json") if st.get("model") else None) or {}
    dims = (raw.get("num_hidden_layers") or ft.get("layers"), raw.get("hidden_size") or ft.get("hidden_size"),
            raw.get("num_attention_heads") or ft.get("heads"))
    return "—" if None in dims else f"L{dims[0]}/H{dims[1]}/A{dims[2]}"


def checklist_section(cfg: AblateConfig, states: list[dict]) -> list[str]:
    """The paper note's reproduction checklist, answered from the base arm's run cards and the grid."""
    base = next((s for s in states if s["name"] == cfg.base_arm and s.get("status") in ("done", "pretrained")), None)
    if base is None:
        return ["## Reproduction checklist", "", f"(the base arm `{cfg.base_arm}` has not finished)"]
    card, ft, metrics = _cards(cfg, base)
    mlm = base.get("mlm") or {}
    causal = [s["name"] for s in states if (s.get("pretrain") or {}).get("objective", "").startswith("CLM")]
    random_init = [s["name"] for s in states if s.get("init") == "random"]
    truncation = []
    for task in cfg.tasks:
        m = _read_json(finetune_dir(Path(cfg.out) / "arms" / cfg.base_arm, task, cfg.seeds[0],
                                    (base.get("lr_chosen") or {}).get(task)) / "metrics.json") or {}
        if tr := (m.get("inputs") or {}).get("train"):
            truncation.append(f"{task}: {tr.get('truncated_examples', 0)} of {tr.get('examples')} training inputs "
                              f"truncated ({tr.get('tokens_cut', 0)} tokens cut), {tr.get('windowed_examples', 0)} "
                              "read in windows")
    probes = sorted({(s.get("setting") or "") for s in states if "probe" in (s.get("setting") or "")})
    model = (card.get("config") or {}).get("model") or {}
    return ["## Reproduction checklist (the paper note's, answered from the run cards)", "",
            f"- Tokenizer, vocabulary, special tokens, maximum length: one WordPiece vocabulary of "
            f"{card.get('vocab_size')} trained on the training documents (`shared/tokenizer/`), [PAD] [UNK] [CLS] "
            f"[SEP] [MASK]; pre-training sequences of {card.get('sequence_lengths')} tokens.",
            f"- Segment ids and [CLS]/[SEP] placement: {pair_example(cfg)}",
            f"- Selected-token mask with the recorded proportions: as trained per arm in the table above "
            f"(base: {_masking(card)}).",
            f"- MLM loss only at selected positions: the held-out protocol scores {mlm.get('predictions')} selected "
            f"positions in {mlm.get('instances')} sequences; the head runs on those positions only.",
            "- NSP used, removed or replaced: the objective column above ("
            + ", ".join(f"{s['name']}: {_objective(_cards(cfg, s)[0])}" for s in states
                        if (s.get("pretrain") or {}).get("objective")
                        and not (s.get("pretrain") or {}).get("model_from")) + ").",
            f"- Depth, width, heads, normalisation placement: base {_shape(base, ft)}"
            f"{', ' + model['norm_position'] + '-LN' if model.get('norm_position') else ''}; other arms in the table above.",
            f"- Pre-training heads apart from task heads: fine-tuning loads the encoder with a new "
            f"{ft.get('head', 'task')} head (init {ft.get('init', '?')}); the MLM/NSP heads are not used downstream.",
            f"- Frozen probing vs full fine-tuning: base arm {ft.get('mode', '?')}; probe arms: "
            f"{'; '.join(probes) or 'none'}.",
            f"- Tokens, updates, batch, compute: base {card.get('tokens_seen') or 0:,} tokens in {card.get('updates')} updates "
            f"of {card.get('global_batch')} sequences, {card.get('train_flops', 0):.3g} FLOPs "
            f"({card.get('wall_time_s')} s, {card.get('precision')}); fine-tuning {metrics.get('tokens_seen')} "
            f"tokens and {metrics.get('train_flops', 0):.3g} FLOPs per {next(iter(cfg.tasks))} run.",
            f"- Long-input truncation and pair formatting: {'; '.join(truncation) or 'see metrics.json'}.",
            f"- Causal and non-pretrained baselines: causal {', '.join(causal) or 'none'}; random init "
            f"{', '.join(random_init) or 'none'}."]


def pair_example(cfg: AblateConfig) -> str:
    """The first held-out pre-training instance of the base data, as tokens and segment ids."""
    try:
        data = open_dataset(Shared(cfg).prepared(cfg.prepare)[1])
        inst = data[0]
        tokens = data.tokenizer().convert_ids_to_tokens([int(i) for i in inst["input_ids"]])
        types = [int(t) for t in inst["token_type_ids"]]
    except Exception as e:  # noqa: BLE001 - the report never fails on an illustration
        return f"(could not read an instance: {e})"
    seps = [i for i, t in enumerate(tokens) if t == "[SEP]"]
    if not seps:
        return " ".join(tokens[:12])
    show = tokens[:4] + ["…"] + tokens[seps[0] - 1:seps[0] + 4] + ["…"] + tokens[-2:]
    return (f"`{' '.join(show)}` ({len(tokens)} tokens; segment ids 0 x {types.count(0)}, 1 x {types.count(1)}; "
            f"[CLS] first, [SEP] at {', '.join(map(str, seps))}).")
