"""The model a pre-training run trains, and the model on one micro-batch.

    build_model()  a new model (model.preset and the model.* shape, initialised as the paper does),
                   model.init_from's (its own architecture, continued), or a checkpoint's (--resume);
                   a new model too large for the device's free memory is refused before it is allocated
    forward()      the model on one micro-batch, padded or padding-free (`packing.pack`)
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from .. import distributed as D
from ..checkpoint import build, load_model
from ..config import PRESETS, SHAPE, preset
from ..model import init_weights, neighbour_attention_, num_parameters, sinusoidal_positions_
from ..packing import pack, pad_rows
from ..runconfig import ModelSection, PretrainConfig, RunConfigError

log = logging.getLogger("bertkit")
ARCHITECTURE = ("hidden_act", "norm_position", "max_position_embeddings", "position_embedding_type")
NO_WEIGHTS = ("hidden_dropout", "attention_dropout", "classifier_pooling")   # change no weight (None: the model's)


def build_model(cfg: PretrainConfig, vocab_size: int, ckpt: Path | None, world: D.World | None = None):
    """The run's model: the checkpoint's (`ckpt`), model.init_from's, or a new one (its memory checked
    against the device's when `world` is given), in the attention direction model.causal asks for."""
    mc = cfg.model
    head_args = {"nsp": cfg.train.nsp}
    if ckpt is not None:                     # weights come from the checkpoint's HF folder
        return _attention(load_model(ckpt / "model", head="pretraining", **head_args), mc.causal)
    if mc.init_from:
        return _attention(_continued_model(cfg, vocab_size, head_args), mc.causal)
    bert_cfg = preset(mc.preset, vocab_size=vocab_size, causal=mc.causal, **{k: getattr(mc, k) for k in ARCHITECTURE},
                      **{k: getattr(mc, k) for k in (*SHAPE, *NO_WEIGHTS) if getattr(mc, k) is not None})
    if world is not None:
        check_memory(bert_cfg, head_args, world, cfg.train.distributed == "fsdp")
    torch.manual_seed(cfg.train.seed)
    model = init_weights(build("pretraining", bert_cfg, **head_args), bert_cfg)
    if mc.position_init == "sinusoidal":
        sinusoidal_positions_(model.bert.embeddings.position.weight, bert_cfg.initializer_range)
    if mc.attention_init == "neighbours":
        neighbour_attention_(model.bert)
    return model


def _continued_model(cfg: PretrainConfig, vocab_size: int, head_args: dict):
    """model.init_from's model: its own architecture (a model key that says otherwise is refused,
    naming it), the dropout and pooling asked for applied, and cfg.model rewritten to what it is,
    so config.yaml and the run card say what trained."""
    mc, defaults = cfg.model, ModelSection()
    changes = {k: getattr(mc, k) for k in NO_WEIGHTS if getattr(mc, k) is not None}
    model = load_model(mc.init_from, head="pretraining", new_head_ok=True, config_changes=changes or None, **head_args)
    have = model.config
    if have.vocab_size != vocab_size:
        raise RunConfigError(f"model.init_from {mc.init_from} has vocab_size {have.vocab_size}, "
                             f"the data's tokenizer {vocab_size}")
    shape = {k: getattr(have, k) for k in SHAPE}
    asked = {k: getattr(mc, k) for k in shape if getattr(mc, k) is not None}
    if mc.preset != defaults.preset:
        asked = {**PRESETS[mc.preset], **asked}
    asked.update({k: getattr(mc, k) for k in ARCHITECTURE if getattr(mc, k) != getattr(defaults, k)})
    wrong = [f"model.{k}={v!r} (it has {getattr(have, k)!r})" for k, v in asked.items() if getattr(have, k) != v]
    if wrong:
        raise RunConfigError(f"model.init_from {mc.init_from} brings its own architecture: " + ", ".join(wrong)
                             + " (drop the key, or start a new model)")
    for k in (*SHAPE, *ARCHITECTURE, *NO_WEIGHTS):
        setattr(mc, k, getattr(have, k))
    mc.preset = next((name for name, p in PRESETS.items() if p == shape), mc.preset)
    return model


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


def forward(model, batch: dict, packed: bool) -> dict:
    """The model on one micro-batch, padded or padding-free (numerically the same)."""
    if packed:
        flat, layout = pack(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                            labels=batch["mlm_labels"])
        flat = pad_rows(flat)                          # a new N every batch: few GEMM row counts (CPU)
        return model(flat["input_ids"], flat["token_type_ids"], None, mlm_labels=flat["labels"],
                     nsp_labels=batch.get("nsp_labels"), packed=layout, position_ids=flat["position_ids"])
    return model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                 mlm_labels=batch["mlm_labels"], nsp_labels=batch.get("nsp_labels"))
