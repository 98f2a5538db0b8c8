"""Hugging Face-format checkpoints: load any BERT folder into a bertkit model, save one back.

This is the only file that knows Hugging Face's parameter names.
"""
from __future__ import annotations

import functools
import json
import logging
import math
import pickle
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..config import BertConfig, ConfigError, architecture_name
from ..errors import BertkitError, first_line
from ..model import HEADS, BertModel, init_weights
from ..probe import PROBE_HEADS, ProbeModel
from ..sources import read_json_object

log = logging.getLogger("bertkit")


class CheckpointError(BertkitError, ValueError):
    """A checkpoint folder is missing, unreadable or does not match the model; the message says which."""


# One table, read both ways: Hugging Face name prefix <-> bertkit name prefix ({n}: a layer number,
# {p}: query/key/value). Encoder names are listed without HF's 'bert.' prefix.
_ENCODER_NAMES = [
    ("embeddings.word_embeddings.", "embeddings.word."),
    ("embeddings.position_embeddings.", "embeddings.position."),
    ("embeddings.token_type_embeddings.", "embeddings.segment."),
    ("embeddings.LayerNorm.", "embeddings.norm."),
    ("encoder.layer.{n}.attention.self.{p}.", "blocks.{n}.attn.{p}."),
    ("encoder.layer.{n}.attention.output.dense.", "blocks.{n}.attn.out."),
    ("encoder.layer.{n}.attention.output.LayerNorm.", "blocks.{n}.norm1."),
    ("encoder.layer.{n}.intermediate.dense.", "blocks.{n}.mlp.up."),
    ("encoder.layer.{n}.output.dense.", "blocks.{n}.mlp.down."),
    ("encoder.layer.{n}.output.LayerNorm.", "blocks.{n}.norm2."),
    ("pooler.dense.", "pooler."),
    ("bertkit_final_norm.", "final_norm."),              # pre-LN only (norm_position='pre'): not a HF name
]
_HEAD_NAMES = [
    ("cls.predictions.transform.dense.", "mlm.dense."),
    ("cls.predictions.transform.LayerNorm.", "mlm.norm."),
    ("cls.predictions.bias", "mlm.bias"),
    ("cls.seq_relationship.", "nsp."),
    ("classifier.", "classifier."),
    ("qa_outputs.", "qa."),
]
_SLOTS = {"n": r"(?P<n>\d+)", "p": r"(?P<p>query|key|value)"}


@functools.lru_cache(maxsize=None)
def _prefix(template: str) -> re.Pattern:
    parts = re.split(r"\{(\w)\}", template)          # literal, slot, literal, ...
    return re.compile("".join(_SLOTS[x] if i % 2 else re.escape(x) for i, x in enumerate(parts)))


def _translate(name: str, table: list[tuple[str, str]], to_bertkit: bool) -> str | None:
    """Rewrite the prefix of `name` by the first row of `table` that matches it (None if none does)."""
    for hf, ours in table:
        src, dst = (hf, ours) if to_bertkit else (ours, hf)
        m = _prefix(src).match(name)
        if m:
            return dst.format(**m.groupdict()) + name[m.end():]
    return None

# Names that carry no information of their own (tied copies, buffers).
_IGNORED = re.compile(r"(^|\.)embeddings\.position_ids$|^cls\.predictions\.decoder\.(weight|bias)$")

# what each kind of checkpoint is called and which weights its head owns: read off the classes
_KINDS = {"encoder": BertModel, **HEADS}
ARCHITECTURES = {name: cls.architecture for name, cls in _KINDS.items()}
HEAD_OF_ARCHITECTURE = {v: k for k, v in ARCHITECTURES.items()}


def _rename(hf_name: str) -> str | None:
    """HF name -> bertkit name ('bert.'-prefixed for the encoder), or None if not a BERT weight."""
    name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", hf_name)
    name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
    inner = name.removeprefix("bert.")
    encoder = _translate(inner, _ENCODER_NAMES, to_bertkit=True)
    return "bert." + encoder if encoder is not None else _translate(name, _HEAD_NAMES, to_bertkit=True)


def bertkit_names(hf_names) -> dict[str, str | None]:
    """Each Hugging Face weight name -> bertkit's (None: not a weight of BERT), leaving out what is
    not a weight (position ids) or is derived (the tied decoder)."""
    return {k: _rename(k) for k in hf_names if not _IGNORED.search(k)}


def _hf_name(name: str, bare: bool) -> str:
    """bertkit name -> HF name (inverse of _rename); bare: a BertModel checkpoint (no 'bert.' prefix)."""
    head = _translate(name, _HEAD_NAMES, to_bertkit=False)
    if head is not None:
        return head
    inner = name.removeprefix("bert.")                       # a bare BertModel has no prefix
    inner = _translate(inner, _ENCODER_NAMES, to_bertkit=False) or inner
    return inner if bare else "bert." + inner


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Tensors of a checkpoint folder: model.safetensors (or shards), else pytorch_model.bin.

    pytorch_model.bin is a pickle: it goes through torch's weights-only unpickler, which builds
    tensors and plain containers and refuses anything else (a pickle can name code to run)."""
    st = path / "model.safetensors"
    index = path / "model.safetensors.index.json"
    binf = path / "pytorch_model.bin"
    if st.is_file():
        return _read_safetensors(st)
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = sorted(set(weight_map.values()))
            if not all(isinstance(f, str) and f.endswith(".safetensors") and "/" not in f and "\\" not in f
                       for f in files):
                raise ValueError("weight_map must map names to .safetensors files in this folder")
        except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{index}: not a valid safetensors index ({type(e).__name__}: "
                                  f"{first_line(e)})") from None
        sd: dict[str, torch.Tensor] = {}
        for f in files:
            if not (path / f).is_file():
                raise CheckpointError(f"{index}: names {f}, which is not in {path}")
            sd.update(_read_safetensors(path / f))
        return sd
    if binf.is_file():
        try:
            sd = torch.load(str(binf), map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            raise CheckpointError(f"{binf}: refused: this pickle holds objects other than tensors (it could run "
                                  "code) or is corrupt; convert trusted weights to model.safetensors") from None
        except Exception as e:  # not a zip / pickle at all, truncated, ...
            raise CheckpointError(f"{binf}: cannot read weights ({type(e).__name__}: {first_line(e)})") from None
        if not isinstance(sd, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                               for k, v in sd.items()):
            raise CheckpointError(f"{binf}: not a state dict of named tensors")
        return sd
    raise CheckpointError(f"{path}: no model.safetensors or pytorch_model.bin (not a checkpoint folder)")


def _read_safetensors(f: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(f))
    except Exception as e:  # not a safetensors file, truncated, unknown dtype, ...
        raise CheckpointError(f"{f}: cannot read weights ({type(e).__name__}: {first_line(e)})") from None


def model_folder(path: str | Path) -> Path:
    """A checkpoint folder; a pre-training checkpoint (checkpoints/step-N) is read from its model/ folder."""
    path = Path(path)
    return path / "model" if not (path / "config.json").is_file() and (path / "model" / "config.json").is_file() \
        else path


def read_config(path: Path) -> tuple[BertConfig, dict[str, Any]]:
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory" if path.exists() else f"{path}: no such directory")
    cj = path / "config.json"
    if not cj.is_file():
        raise CheckpointError(f"{path}: no config.json (not a checkpoint folder)")
    raw = read_json_object(cj, CheckpointError)
    try:
        check_config_json(raw, cj)
        if raw.get("bertkit_incomplete"):          # see bertkit.outdir
            raise CheckpointError(f"{path}: the checkpoint of an unfinished run ({raw['bertkit_incomplete']}; "
                                  f"killed, failed or still running): not loaded")
        if raw.get("architectures"):          # BertkitForMaskedLM (model_type 'bertkit') names the same head
            raw = {**raw, "architectures": [architecture_name(a, False) for a in raw["architectures"]]}
        return BertConfig.from_hf_dict(raw, source=str(cj)), raw
    except ConfigError as e:
        raise CheckpointError(str(e)) from None


# config.json keys bertkit reads: type and range, checked before anything is built from them
_INT_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
               "max_position_embeddings", "type_vocab_size")
_MAX_INT = 1 << 24                   # 16M rows / units: beyond any BERT, and beyond what would fit in memory
_PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")
_PROBLEMS = {"regression": "regression", "multi_label_classification": "multi_label"}   # config.json's -> the model's


def check_config_json(raw: Any, cj: Path) -> None:
    """Every config.json field bertkit uses has the type and range it needs; else one CheckpointError
    naming the field (a string '768' or a NaN dropout would otherwise fail deep inside the model)."""
    def bad(key: str, want: str) -> CheckpointError:
        return CheckpointError(f"{cj}: {key} must be {want}, got {raw[key]!r:.60}")

    def number(v: Any, kinds: type | tuple = (int, float)) -> bool:
        return isinstance(v, kinds) and not isinstance(v, bool)

    if not isinstance(raw, dict):
        raise CheckpointError(f"{cj}: expected a JSON object of settings, got {type(raw).__name__}")
    for key in _INT_FIELDS:
        if key in raw and not (number(raw[key], int) and 0 < raw[key] <= _MAX_INT):
            raise bad(key, f"an integer in [1, {_MAX_INT}]")
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
        v = raw.get(key)
        if (v is not None or (key in raw and key != "classifier_dropout")) and not (number(v) and 0.0 <= v < 1.0):
            raise bad(key, "a probability in [0, 1)")
    for key, low in (("layer_norm_eps", "> 0"), ("initializer_range", ">= 0")):
        v = raw.get(key)
        if key in raw and not (number(v) and math.isfinite(v) and (v > 0 if low == "> 0" else v >= 0)):
            raise bad(key, f"a finite number {low}")
    v, vocab = raw.get("pad_token_id"), raw.get("vocab_size", 30522)
    if v is not None and not (number(v, int) and 0 <= v < vocab):
        raise bad("pad_token_id", f"null or an id in [0, vocab_size {vocab})")
    for key in ("model_type", "hidden_act", "position_embedding_type", "bertkit_norm_position", "classifier_pooling"):
        if key in raw and raw[key] is not None and not isinstance(raw[key], str):
            raise bad(key, "a string")
    for key in ("tie_word_embeddings", "bertkit_causal", "is_decoder", "add_cross_attention"):
        if key in raw and not isinstance(raw[key], bool):
            raise bad(key, "true or false")
    archs = raw.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise bad("architectures", "a list of class names")
    if raw.get("problem_type") is not None and raw["problem_type"] not in _PROBLEM_TYPES:
        raise bad("problem_type", f"null or one of {', '.join(_PROBLEM_TYPES)}")
    labels = raw.get("id2label")
    if labels is not None:
        if not (isinstance(labels, dict) and all(isinstance(k, str) and k.isdigit() and isinstance(v, str)
                                                 for k, v in labels.items())):
            raise bad("id2label", 'an object of "0": "label", "1": ... entries')
        if sorted(int(k) for k in labels) != list(range(len(labels))):
            raise bad("id2label", "numbered 0, 1, ... without gaps")


def heads_in(state_names: set[str]) -> list[str]:
    """Which heads a set of (bertkit) weight names carries."""
    return [head for prefix, head in (("mlm.", "masked_lm"), ("nsp.", "nsp"), ("classifier.", "classifier"),
                                      ("qa.", "question_answering")) if any(n.startswith(prefix) for n in state_names)]


def build(head: str, cfg: BertConfig, random_init: bool = True, **head_args: Any) -> nn.Module:
    """A freshly initialised model for `head` ('encoder' = bare BertModel). `random_init=False`: its
    weights left as allocated, for a caller that fills every one (`load_model`): all-MiniLM-L6-v2 in
    0.03 s instead of 0.3-0.4, and torch's global random generator left as it was."""
    if head not in _KINDS:
        raise CheckpointError(f"unknown head {head!r}; choose from {', '.join(_KINDS)}")
    if random_init:
        return init_weights(_KINDS[head](cfg, **head_args), cfg)
    with torch.device("meta"):                   # shapes only; then memory, unset
        model = _KINDS[head](cfg, **head_args).to_empty(device="cpu")
    if stray := [f"{name}.{k}" for name, m in model.named_modules() for k, v in vars(m).items()
                 if isinstance(v, torch.Tensor) and v.is_meta]:
        raise RuntimeError(f"tensors made outside parameters stay on the meta device: {stray}")
    return model


def load_model(path: str | Path, head: str | None = None, new_head_ok: bool = False,
               config_changes: dict[str, Any] | None = None,
               config_json: tuple[BertConfig, dict[str, Any]] | None = None, random_init: bool = True,
               **head_args: Any) -> nn.Module:
    """Load a Hugging Face BERT folder as bertkit `head` (default: the head its config names).
    `config_changes`: BertConfig fields that change no weight shape (dropout, pooling) set for
    this use, as fine-tuning's --dropout / --pooling. `config_json`: the folder's `read_config`,
    when the caller has read it already (else it is read here).

    Weights of other heads are ignored; encoder weights that are missing, unknown or of the
    wrong shape are one CheckpointError listing them. A head the checkpoint lacks is an error
    unless `new_head_ok` (fine-tuning), in which case it is freshly initialised.
    `random_init=False` (inference; ignored with `new_head_ok`): the weights are not randomly
    initialised before the checkpoint's are copied in (`build`): faster, and nothing is drawn from
    torch's global random generator for them. Training keeps the default, so what it draws after
    loading stays as it was.
    The model is returned in eval mode, as `from_pretrained` does: two calls give the same outputs.
    """
    path = Path(path)
    config_json = config_json or read_config(path)
    cfg, raw = config_json
    if config_changes:
        cfg = cfg.replace(**config_changes)
    if head != "encoder" and not new_head_ok and ("bertkit_probe" in raw or "bertkit_probe_layers" in raw):
        return load_probe(path, config_json, head, random_init)   # a linear head on frozen features (finetune --freeze)
    sd = read_state_dict(path)
    names = bertkit_names(sd)
    unknown = [k for k, new in names.items() if new is None]
    renamed = {new: sd[k] for k, new in names.items() if new is not None}
    if unknown:
        raise CheckpointError(f"{path}: unexpected weights not part of a BERT model: {_first(sorted(unknown), 20)}")
    check_weights_fit_config(cfg, renamed, path)
    if head is None:
        archs = raw.get("architectures")
        if archs:
            head = HEAD_OF_ARCHITECTURE.get(archs[0], "encoder")
        else:  # no architectures in config.json: go by the weights present
            found = heads_in(set(renamed))
            head = ("pretraining" if "nsp" in found and "masked_lm" in found else "masked_lm" if "masked_lm" in found
                    else "question_answering" if "question_answering" in found else "encoder")
    if head in ("sequence_classification", "token_classification") and "num_labels" not in head_args:
        if "classifier.weight" in renamed:
            head_args["num_labels"] = renamed["classifier.weight"].shape[0]
        elif raw.get("id2label"):
            head_args["num_labels"] = len(raw["id2label"])
    if head == "sequence_classification" and "problem" not in head_args:
        head_args["problem"] = _PROBLEMS.get(raw.get("problem_type"))
    if head == "pretraining" and "nsp" not in head_args:
        head_args["nsp"] = "nsp.weight" in renamed or not any(n.startswith("mlm.") for n in renamed)
    model = _build_loaded(head, cfg, renamed, path, new_head_ok, random_init or new_head_ok, **head_args)
    decoder = sd.get("cls.predictions.decoder.weight")
    if (decoder is not None and hasattr(model, "mlm") and raw.get("tie_word_embeddings") is False
            and not torch.equal(decoder, renamed.get("bert.embeddings.word.weight", decoder))):
        _untie_decoder(model, decoder)
    model.config.extra = dict(cfg.extra)    # id2label, bertkit_* keys etc. for callers
    return model.eval()    # inference is deterministic (no dropout); training calls model.train() itself


def check_weights_fit_config(cfg: BertConfig, renamed: dict[str, torch.Tensor], path: Path,
                             config_file: str = "config.json") -> None:
    """The sizes config.json gives match the encoder weights (checked before a model is built, so a
    config.json asking for a huge model is an error, not an allocation)."""
    checks = [("embeddings.word.weight", 0, "vocab_size", cfg.vocab_size, "rows"),
              ("embeddings.word.weight", 1, "hidden_size", cfg.hidden_size, "columns"),
              ("embeddings.position.weight", 0, "max_position_embeddings", cfg.max_position_embeddings, "rows"),
              ("embeddings.segment.weight", 0, "type_vocab_size", cfg.type_vocab_size, "rows"),
              ("blocks.0.mlp.up.weight", 0, "intermediate_size", cfg.intermediate_size, "rows")]
    for name, dim, key, value, what in checks:
        t = renamed.get("bert." + name)
        if t is not None and (t.dim() != 2 or t.shape[dim] != value):
            hf = _hf_name("bert." + name, True)
            raise CheckpointError(f"{path}: {config_file} says {key} {value} but {hf} has "
                                  f"{t.shape[dim] if t.dim() == 2 else '?'} {what} (shape {tuple(t.shape)})")
    layers = {int(m.group(1)) for n in renamed if (m := re.match(r"bert\.blocks\.(\d+)\.", n))}
    if layers and layers != set(range(cfg.num_layers)):
        raise CheckpointError(f"{path}: {config_file}'s num_hidden_layers is {cfg.num_layers} but the weights hold "
                              f"{len(layers)} layers (numbered {min(layers)}..{max(layers)})")


def check_inputs_fit(cfg: BertConfig, vocab_size: int | None = None, max_length: int | None = None,
                     option: str = "--max-length", where: str | Path = "") -> None:
    """A tokenizer of `vocab_size` ids indexes the model's embedding rows, and `max_length` (the
    `option` that asked for it) fits its positions: an error naming both, before anything runs."""
    if vocab_size is not None and vocab_size > cfg.vocab_size:
        raise CheckpointError(f"{f'{where}: ' if where else ''}the tokenizer has {vocab_size} ids but the model "
                              f"only {cfg.vocab_size} embedding rows (vocab_size): not a matching tokenizer")
    if max_length is None:
        return
    if max_length > cfg.max_position_embeddings and cfg.position_embedding_type != "alibi":
        raise CheckpointError(f"{option} {max_length}: the model has {cfg.max_position_embeddings} positions "
                              f"(max_position_embeddings); use at most {cfg.max_position_embeddings}")
    trained = trained_length(cfg)
    if cfg.position_embedding_type == "alibi" and max_length > trained and (max_length, trained) not in _WARNED:
        _WARNED.add((max_length, trained))
        log.warning("%s %d is past the training length %d (ALiBi: no position table, so longer inputs run; "
                    "accuracy may drop)", option, max_length, trained)


_WARNED: set[tuple[int, int]] = set()      # (length, training length) said once per process


def trained_length(cfg: BertConfig) -> int:
    """The longest inputs the model was trained on, as config.json records it (pre-training's
    sequences, `bertkit_trained_length`; fine-tuning's, `bertkit_max_length`), else its positions."""
    said = [v for k in ("bertkit_trained_length", "bertkit_max_length")
            if isinstance(v := cfg.extra.get(k), int) and not isinstance(v, bool) and v > 0]
    return max(said) if said else cfg.max_position_embeddings


def length_limit(cfg: BertConfig, max_length: int | None) -> int:
    """The most tokens one input may have: `max_length` (default: the positions), within the
    position table; an ALiBi model has none, so any length (past its training length: see
    `check_inputs_fit`)."""
    if cfg.position_embedding_type == "alibi":
        return max_length or cfg.max_position_embeddings
    return min(max_length or cfg.max_position_embeddings, cfg.max_position_embeddings)


def _build_loaded(head: str, cfg: BertConfig, renamed: dict, path: Path, new_head_ok: bool, random_init: bool,
                  **head_args: Any) -> nn.Module:
    """`build(head, cfg)` holding the (bertkit-named) weights `renamed`, checked (`_check_and_load`);
    without `random_init` every weight must be in `renamed` (the check refuses a missing one)."""
    if head == "encoder":  # bare BertModel: our names have no 'bert.' prefix
        head_args.setdefault("add_pooler", "bert.pooler.weight" in renamed)
        renamed = {k[5:]: v for k, v in renamed.items() if k.startswith("bert.")}
    model = build(head, cfg, random_init, **head_args)
    _check_and_load(model.state_dict(), renamed, path, head, new_head_ok)
    return model


def _check_and_load(target: dict, renamed: dict, path: Path, head: str, new_head_ok: bool) -> None:
    owned = _KINDS[head].weight_prefixes
    tied = {"mlm.decoder.weight", "bert.embeddings.word.weight", "embeddings.word.weight"}
    missing_encoder, missing_head, shapes = [], [], []
    for name, t in target.items():
        if name == "mlm.decoder.weight":
            continue
        if name not in renamed:
            is_head = name.startswith(owned) or name.endswith(("pooler.weight", "pooler.bias"))
            (missing_head if is_head else missing_encoder).append(name)
        elif tuple(renamed[name].shape) != tuple(t.shape):
            shapes.append(f"{_hf_name(name, head == 'encoder') if name not in tied else name}: "
                          f"checkpoint {tuple(renamed[name].shape)} vs config {tuple(t.shape)}")
    if shapes:
        raise CheckpointError(f"{path}: weights of the wrong shape for config.json: " + "; ".join(shapes[:10]))
    if missing_encoder:
        raise CheckpointError(f"{path}: missing encoder weights: "
                              f"{_first([_hf_name(n, head == 'encoder') for n in missing_encoder], 10)}")
    if missing_head:
        names = [_hf_name(n, head == "encoder") for n in missing_head]
        if not new_head_ok:
            raise CheckpointError(f"{path}: has no weights for the {head} head ({', '.join(names)}); "
                                  f"it holds: {', '.join(heads_in(set(renamed))) or 'the encoder only'}")
        log.info("%s: new %s head weights initialised: %s", path, head, ", ".join(names))
    with torch.no_grad():
        for name, t in target.items():
            if name in renamed and name != "mlm.decoder.weight":
                t.copy_(renamed[name])


def _first(names: list[str], n: int) -> str:
    """The first `n` names, and how many more there are."""
    return ", ".join(names[:n]) + (f" (+{len(names) - n} more)" if len(names) > n else "")


def _untie_decoder(model: nn.Module, weight: torch.Tensor) -> None:
    """A checkpoint saved with tie_word_embeddings=False has its own MLM output matrix."""
    decoder = nn.Embedding(*weight.shape)
    with torch.no_grad():
        decoder.weight.copy_(weight)
    model.mlm.decoder = decoder
    model.config.extra["tie_word_embeddings"] = False


def save_model(model: nn.Module, path: str | Path, extra_config: dict[str, Any] | None = None) -> None:
    """Write config.json + model.safetensors that transformers loads for the matching BertFor* class."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    head = getattr(model, "head", "encoder")
    tensors = {}
    for name, t in model.state_dict().items():
        if name == "mlm.decoder.weight":
            if model.mlm.decoder is not model.bert.embeddings.word:   # untied: its own matrix
                tensors["cls.predictions.decoder.weight"] = t.detach().to("cpu").contiguous()
                tensors["cls.predictions.decoder.bias"] = model.mlm.bias.detach().to("cpu").clone()
            continue                       # tied to the word embeddings; HF re-ties it on load
        tensors[_hf_name(name, head == "encoder")] = t.detach().to("cpu").contiguous()
    more: dict[str, Any] = dict(extra_config or {})
    if head in ("sequence_classification", "token_classification"):
        id2label = (more.pop("id2label", None) or model.config.extra.get("id2label")
                    or {i: f"LABEL_{i}" for i in range(model.num_labels)})
        more["id2label"] = {str(k): v for k, v in id2label.items()}
        more["label2id"] = {v: int(k) for k, v in more["id2label"].items()}
        if head == "sequence_classification":
            own = {v: k for k, v in _PROBLEMS.items()}
            more["problem_type"] = own.get(model.problem, "single_label_classification")
    cfg_dict = model.config.to_hf_dict(architectures=[ARCHITECTURES[head]], **more)
    for k in ("num_labels", "transformers_version", "_name_or_path"):
        cfg_dict.pop(k, None)
    tmp = path / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(path / "model.safetensors")
    (path / "config.json").write_text(json.dumps(cfg_dict, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def load_probe(path: str | Path, config_json: tuple[BertConfig, dict[str, Any]], head: str | None = None,
               random_init: bool = True) -> ProbeModel:
    """A probe checkpoint folder (config.json with `bertkit_probe`; `config_json`: its `read_config`)
    as a ProbeModel in eval mode (`random_init`: `load_model`'s, for its encoder)."""
    path = Path(path)
    raw = config_json[1]
    spec = raw.get("bertkit_probe")
    if spec is None and "bertkit_probe_layers" in raw:  # an older bertkit's spelling
        raise CheckpointError(f"{path}/config.json: bertkit_probe_layers K is now "
                              f"bertkit_probe {{\"features\": \"concat_last_K\"}}")
    if not isinstance(spec, dict) or not isinstance(spec.get("features"), str):
        raise CheckpointError(f"{path}/config.json: bertkit_probe must be an object with a \"features\" string")
    arch = (raw.get("architectures") or [""])[0]
    own = HEAD_OF_ARCHITECTURE.get(arch) if isinstance(arch, str) else None
    if own not in PROBE_HEADS:
        raise CheckpointError(f"{path}/config.json: a probe checkpoint names architecture {arch!r}; expected "
                              f"BertForSequenceClassification or BertForTokenClassification")
    if head is not None and head != own:
        raise CheckpointError(f"{path}: a frozen-feature probe ({own}); it cannot be loaded as {head}")
    encoder = load_model(path, head="encoder", config_json=config_json, random_init=random_init)
    sd = read_state_dict(path)
    weight = sd.get("classifier.weight")
    if weight is None or weight.dim() != 2:
        raise CheckpointError(f"{path}: a probe checkpoint without classifier.weight")
    problem = _PROBLEMS.get(raw.get("problem_type"))
    try:
        model = ProbeModel(encoder, own, weight.shape[0], spec["features"], problem, spec.get("pooling"))
    except BertkitError as e:
        raise CheckpointError(f"{path}/config.json: bertkit_probe: {e}") from None
    head_sd = {k[len("classifier."):]: v for k, v in sd.items() if k.startswith("classifier.")}
    try:
        model.classifier.load_state_dict(head_sd)
    except RuntimeError as e:
        raise CheckpointError(f"{path}: probe head weights do not match bertkit_probe "
                              f"{spec['features']!r}: {first_line(e, 200)}") from None
    return model.eval()          # config.json's id2label etc.: model.config.extra (the encoder's, same file)


# ---- Google's original TensorFlow names (google-research/bert's modeling.py) ----------------------
# They become HF names by the rules of transformers' former load_tf_weights_in_bert ('/' -> '.',
# layer_N -> layer.N, kernel/gamma/output_weights -> weight, beta/output_bias -> bias, a kernel is
# [in, out] and is transposed), then bertkit names through the one table above.
GOOGLE_OPTIMIZER_STATE = re.compile(r"(^|/)(adam_[mv]|Adam(_\d+)?|AdamWeightDecayOptimizer(_\d+)?|global_step"
                                    r"|beta[12]_power|bad_steps|good_steps|loss_scale)$")
_GOOGLE_LAST = {"kernel": "weight", "gamma": "weight", "output_weights": "weight", "beta": "bias",
                "output_bias": "bias", "bias": "bias"}


def google_to_hf(tf_name: str) -> tuple[str, bool] | None:
    """(HF name, transpose?) of one of Google's variable names; None if it is not a BERT weight."""
    *scope, last = re.sub(r"(^|/)layer_(\d+)(?=/)", r"\1layer/\2", tf_name).split("/")
    if last.endswith("_embeddings"):
        scope, last = [*scope, last], "weight"
    elif last in _GOOGLE_LAST:
        last = _GOOGLE_LAST[last]
    else:
        return None
    hf = ".".join([*scope, last])
    renamed = _rename(hf)
    if renamed is None or not re.search(r"(^|\.)(weight|bias)$", renamed) or renamed.startswith(("classifier", "qa")):
        return None
    return hf, tf_name.endswith("/kernel")


def from_google(tensors: dict[str, torch.Tensor], cfg: BertConfig, source: Path) -> nn.Module:
    """A bertkit model of Google's TF weights (keyed by their TF names, optimizer state left out):
    BertForPreTraining when the NSP head is there, BertForMaskedLM for the MLM head alone, else
    BertModel. A name that is not a BERT weight, a missing weight or a wrong shape is one
    CheckpointError naming `source`."""
    mapped = {name: google_to_hf(name) for name in tensors}
    unknown = [name for name, m in mapped.items() if m is None]
    if unknown:
        raise CheckpointError(f"{source}: tensors that are not weights of Google's BERT: {_first(sorted(unknown), 10)}")
    renamed = {_rename(hf): tensors[name].t().contiguous() if transpose else tensors[name]
               for name, (hf, transpose) in mapped.items()}
    check_weights_fit_config(cfg, renamed, source, "bert_config.json")
    found = heads_in(set(renamed))
    head = "pretraining" if "nsp" in found else "masked_lm" if "masked_lm" in found else "encoder"
    return _build_loaded(head, cfg, renamed, source, False, False).eval()   # every weight from the TF file
