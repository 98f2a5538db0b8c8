"""The fine-tuning run card: the paper note's reproduction checklist, answered for one run.

run_card.json holds everything (the resolved FinetuneConfig included); run_card.md is the same
read as a checklist: frozen probe or full fine-tuning (and the probe's features), the model's
attention direction and normalisation placement, how long inputs were read (windows per example
or truncation counts), batch, updates, tokens seen and FLOPs, seed, the dev result.

FLOP model (as `runlog`'s for pre-training): a multiply-add is 2 FLOPs; the encoder's forward costs
2 x (matmul weights) x tokens + 4 T^2 C L per sequence; an update costs 3 x forward (backward =
2 x forward), or 1 x forward for a frozen probe (no backward through the encoder). Tokens are the
real ones on packed batches, B x T on padded ones. Task heads (C x labels) are left out.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Sequence
from ..runlog import _fmt, matmul_weights, md_section

FILES = ("config.json + model.safetensors + tokenizer files: the best checkpoint on dev; finetune.yaml: the "
         "resolved config; metrics.json, metrics.jsonl, dev_predictions.jsonl; run_card.json")


def forward_flops(config, tokens: int, squares: int) -> float:
    """Encoder forward FLOPs over `tokens` processed tokens whose sequences' squared lengths sum
    to `squares`."""
    return 2.0 * matmul_weights(config) * tokens + 4.0 * squares * config.hidden_size * config.num_layers


def batch_flops(config, attention_mask, packed: bool, frozen: bool) -> float:
    """FLOPs of one update on a collated batch ((B, T) or (B, K, T) attention mask)."""
    lengths = attention_mask.reshape(-1, attention_mask.shape[-1]).sum(-1)
    if packed:
        tokens, squares = int(lengths.sum()), int((lengths * lengths).sum())
    else:
        n, T = lengths.numel(), attention_mask.shape[-1]
        tokens, squares = n * T, n * T * T
    return forward_flops(config, tokens, squares) * (1.0 if frozen else 3.0)


def eval_flops(config, features: Sequence[dict]) -> float:
    """FLOPs of one pass over evaluation features (packed: real tokens only)."""
    lengths = [len(r) for f in features for r in (f["input_ids"] if f["input_ids"] and
                                                 isinstance(f["input_ids"][0], list) else [f["input_ids"]])]
    return forward_flops(config, sum(lengths), sum(n * n for n in lengths))


def describe_inputs(inputs: dict, max_length: int) -> str:
    """One line: how inputs longer than max_length were read."""
    parts = []
    for split in ("train", "dev"):
        s = inputs.get(split)
        if not s:
            continue
        text = f"{split}: {s['examples']} examples -> {s['features']} inputs"
        if s["windowed_examples"]:
            text += (f", {s['windowed_examples']} examples in 2..{s['max_windows']} windows "
                     f"({s['windows_per_example']:.2f} per example)")
        if s["truncated_examples"]:
            text += f", {s['truncated_examples']} truncated ({s['tokens_cut']} tokens cut)"
        parts.append(text)
    how = (f"windows (stride {inputs['stride']})" if inputs.get("windows") else "longest-first truncation")
    return f"max length {max_length}, {how}; " + "; ".join(parts)


def build_card(cfg, task, model, labels, result: dict, command: str, facts: dict, hardware: dict) -> dict[str, Any]:
    """run_card.json of a fine-tuning run."""
    config = model.config
    probe = model.record() if hasattr(model, "record") else None
    card = {
        "name": f"finetune {task.name}", "command": command,
        "mode": "frozen-feature probe" if probe else "full fine-tuning", "probe": probe,
        "model": cfg.model, "init": cfg.init, "parameters": sum(p.numel() for p in model.parameters()),
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "attention": "causal (left-to-right)" if config.causal else "bidirectional",
        "normalization": f"{getattr(config, 'norm_position', 'post')}-LN",
        "dropout": {"hidden": config.hidden_dropout, "attention": config.attention_dropout,
                    "head": config.head_dropout},
        "pooling": None if probe or task.head not in ("sequence_classification", "multiple_choice")
                   else config.classifier_pooling,
        "layers": config.num_layers, "hidden_size": config.hidden_size, "heads": config.num_heads,
        "task": task.name, "head": task.head, "labels": labels, "max_length": cfg.max_length,
        "inputs": result["inputs"], "global_batch": cfg.batch_size, "epochs": cfg.epochs, "updates": result["updates"],
        "optimizer": cfg.optimizer, "peak_lr": cfg.lr, "layer_lr_decay": cfg.layer_lr_decay, "warmup": cfg.warmup,
        "weight_decay": cfg.weight_decay,
        "tokens_seen": result["tokens_seen"], "train_flops": result["train_flops"],
        "eval_flops": result["eval_flops"], "packed": cfg.packed, "seed": cfg.seed,
        "precision": result.get("precision", "float32"), "precision_reason": result.get("precision_reason"),
        "attention_kernel": result.get("attention_kernel", "sdpa"),
        "attention_kernel_reason": result.get("attention_kernel_reason"),
        "deterministic": result.get("deterministic"),
        "data": f"{result['train_file']} ({result['train_examples']} examples), dev {result['dev_file']}",
        "best_step": result["best_step"],
        "final_eval": {k: v for k, v in (result["dev"] or {}).items() if not isinstance(v, dict)},
        "wall_time_s": result["wall_time_s"], "tokens_per_s": result["tokens_per_s"], "hardware": hardware,
        "config": dataclasses.asdict(cfg)}
    if "bertkit_null_threshold" in facts:
        card["null_threshold"] = facts["bertkit_null_threshold"]
    return card


def write_card(out: Path, card: dict) -> None:
    """run_card.json and run_card.md."""
    (out / "run_card.json").write_text(json.dumps(card, indent=2, default=str) + "\n", encoding="utf-8")
    probe = card["probe"]
    mode = card["mode"] + (f" on {probe['features']} (layers {probe['layers']}"
                           f"{', ' + probe['pooling'] + ' pooling' if probe.get('pooling') else ''})" if probe else "")

    def why(key: str):                                # a choice, and why it was made where the card says
        return f"{card[key]} ({card[key + '_reason']})" if card.get(key + "_reason") else card[key]

    rows = [("frozen probe or full fine-tuning", mode),
            ("model", f"{card['model']} (init {card['init']}): {card['layers']} layers, hidden {card['hidden_size']}, "
                      f"{card['heads']} heads, {_fmt(card['parameters'])} parameters "
                      f"({_fmt(card['trainable_parameters'])} trained)"),
            ("attention direction", card["attention"]), ("normalization placement", card["normalization"]),
            ("task / head", f"{card['task']} / {card['head']}" + (f", labels {card['labels']}" if card["labels"] else "")
             + (f"; pooler over {'[CLS]' if card['pooling'] == 'cls' else 'the mean of the tokens'}"
                if card.get("pooling") else "")),
            ("long inputs", describe_inputs(card["inputs"], card["max_length"])),
            ("batch / epochs / updates", f"{card['global_batch']} / {card['epochs']} / {card['updates']}"),
            ("optimizer", f"{card['optimizer']}, peak lr {card['peak_lr']}, warmup {card['warmup']}, "
                          f"weight decay {card['weight_decay']}"
                          + (f", layer-wise lr decay {card['layer_lr_decay']}" if card.get("layer_lr_decay", 1.0) != 1.0
                             else "")),
            ("dropout", ", ".join(f"{k} {v}" for k, v in card["dropout"].items()) if card.get("dropout") else "-"),
            ("tokens seen (training)", _fmt(card["tokens_seen"])),
            ("compute", f"{_fmt(card['train_flops'])} FLOPs training + {_fmt(card['eval_flops'])} FLOPs dev "
                        f"evaluation"),
            ("seed", card["seed"]), ("data", card["data"]), ("precision", why("precision")),
            ("attention kernel (training)", why("attention_kernel")),
            ("deterministic", card.get("deterministic") or "-"),
            ("wall time (s)", card["wall_time_s"])]
    if "null_threshold" in card:
        rows.append(("SQuAD 2.0 null threshold (best F1 on dev, saved)", card["null_threshold"]))
    lines = [f"# Run card: {card['name']}", "", f"Command: `{card['command']}`",
             *md_section("Reproduction checklist", rows, "item")]
    if card["final_eval"]:
        lines += md_section(f"Dev evaluation (best checkpoint, update {card['best_step']})", card["final_eval"])
    if card.get("hardware"):
        lines += md_section("Hardware", card["hardware"], "item")
    lines += ["", "Files: " + FILES + ". The resolved config is also in run_card.json (`config`)."]
    (out / "run_card.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def seeds_card_lines(summary: dict) -> list[str]:
    """The run card's section of a `--seeds` run (`finetune.seeds`): per dev metric the
    seeds' mean, standard deviation and min-max, the collapsed seeds, the chosen seed and why."""
    n, gone = len(summary["seeds"]), summary["collapse"]["seeds"]
    lines = ["## Seeds", "", f"{n} seeds ({', '.join(map(str, summary['seeds']))}), each in `seed-N/`; this "
             f"folder's model is seed {summary['chosen_seed']}, {summary['chosen_by']}.", "",
             "| dev metric | mean | std (n - 1) | min | max |", "|---|---|---|---|---|"]
    lines += [f"| {k} | {_fmt(s['mean'])} | {_fmt(s['std']) if s['std'] is not None else '-'} | {_fmt(s['min'])} | "
              f"{_fmt(s['max'])} |" for k, s in summary["metrics"].items()]
    collapse = summary["collapse"]
    lines += ["", f"Collapsed ({collapse['rule']}): " + (", ".join(map(str, gone)) or "none") if gone is not None
              else f"Collapsed: {collapse['why']}"]
    lines += ["", "| seed | " + summary["main_metric"] + " | collapsed | wall time (s) |", "|---|---|---|---|"]
    lines += [f"| {r['seed']} | {_fmt(r['dev'].get(summary['main_metric']))} | "
              f"{'-' if r['collapsed'] is None else 'yes' if r['collapsed'] else 'no'} | {r['wall_time_s']} |"
              for r in summary["runs"]]
    return lines
