"""Run configuration: typed dataclasses, values only, read from YAML plus `--section.key=value`.

    cfg = load_config(PretrainConfig, "configs/pretrain/mini.yaml", ["--train.max_steps=100"])
    save_config(cfg, run_dir / "config.yaml")        # the resolved config of every run

Unknown keys are an error naming the file (or option) and the closest known key; values are
checked against the field's type. `PretrainConfig` is the configuration of `bertkit pretrain`.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

from .config import ACTIVATIONS, PRESETS
from .errors import BertkitError, first_line
from .outdir import write_whole


class RunConfigError(BertkitError, ValueError):
    """A configuration file or override is wrong; the message names the key."""


# ---- the range a number obeys, written on its field: `batch_size: Annotated[int, AT_LEAST_1]` ----------
@dataclass(frozen=True)
class Rule:
    """A range a number must lie in; `check_fields` applies it (None passes where the type allows None).
    A NaN fails every rule."""
    what: str
    ok: Callable[[float], bool]

    def problem(self, value: Any) -> str | None:
        """'must be at least 1, got 0', or None when `value` obeys the rule."""
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if number and self.ok(value) else f"must be {self.what}, got {value!r}"


AT_LEAST_1 = Rule("at least 1", lambda v: v >= 1)
NON_NEGATIVE = Rule("a finite number >= 0", lambda v: 0 <= v < math.inf)
POSITIVE = Rule("a finite number > 0", lambda v: 0 < v < math.inf)
PROBABILITY = Rule("a probability in [0, 1)", lambda v: 0 <= v < 1)
OPEN_UNIT = Rule("in (0, 1)", lambda v: 0 < v < 1)
HALF_OPEN_UNIT = Rule("in (0, 1]", lambda v: 0 < v <= 1)
UNIT = Rule("in [0, 1]", lambda v: 0 <= v <= 1)
THREADS = Rule("0 (torch's default) or a number of threads", lambda v: 0 <= v <= 4096)
SEED = Rule("an integer in [0, 2**32 - 1]", lambda v: 0 <= v < 2 ** 32)


def check_fields(obj: Any, prefix: str = "", error: type[Exception] | None = None) -> None:
    """Every field of the dataclass `obj` obeys its annotation: a `Literal[...]` value is one of its
    choices, an `Annotated[..., Rule]` number lies in its range; None passes where the type allows
    it. One `error` (default RunConfigError) naming the field (`prefix` + name). Nested sections
    are checked by their owner."""
    error = error or RunConfigError
    hints = typing.get_type_hints(type(obj), include_extras=True)
    for f in fields(obj):
        kind, value = hints[f.name], getattr(obj, f.name)
        rules: list[Rule] = []
        if typing.get_origin(kind) is Annotated:
            kind, *meta = typing.get_args(kind)
            rules = [m for m in meta if isinstance(m, Rule)]
        args = typing.get_args(kind) if typing.get_origin(kind) in (typing.Union, types.UnionType) else (kind,)
        if value is None and type(None) in args:
            continue
        for arg in args:
            if typing.get_origin(arg) is Literal and value not in typing.get_args(arg):
                raise error(not_one_of(f"{prefix}{f.name}", value, typing.get_args(arg)))
        for rule in rules:
            if problem := rule.problem(value):
                raise error(f"{prefix}{f.name} {problem}")


def not_one_of(where: str, value: Any, choices) -> str:
    """The error for a value outside its `choices`: "where: 'x' is not one of a, b (did you mean 'a'?)"."""
    names = [str(c) for c in choices]
    close = difflib.get_close_matches(str(value), names, n=1)
    return f"{where}: {value!r} is not one of {', '.join(names)}" + (f" (did you mean {close[0]!r}?)" if close else "")


class Checked:
    """A dataclass base: its fields are checked (`check_fields`) whenever one is made."""

    def __post_init__(self) -> None:
        check_fields(self)


# ---- the configuration of `bertkit pretrain` --------------------------------------------------
@dataclass
class ModelSection:
    preset: str = "mini"
    """Architecture preset (tiny, mini, small, medium, base, large); the fields below override it."""
    num_layers: Annotated[int | None, AT_LEAST_1] = None
    hidden_size: Annotated[int | None, AT_LEAST_1] = None
    num_heads: Annotated[int | None, AT_LEAST_1] = None
    intermediate_size: Annotated[int | None, AT_LEAST_1] = None
    max_position_embeddings: Annotated[int, AT_LEAST_1] = 512
    hidden_act: str = "gelu"
    hidden_dropout: Annotated[float | None, PROBABILITY] = None
    """Dropout on embeddings, attention output and FFN output. None = 0.1 (BERT) for a new model,
    model.init_from's own when continuing one (a value given is applied to it)."""
    attention_dropout: Annotated[float | None, PROBABILITY] = None
    """Dropout on the attention probabilities; None as hidden_dropout."""
    norm_position: Literal["post", "pre"] = "post"
    """LayerNorm placement: 'post' (BERT, Hugging Face compatible) or 'pre' (pre-norm + a final LayerNorm)."""
    causal: bool | None = None
    """Attention: false = bidirectional (BERT), true = causal (left-to-right, recorded in config.json
    so fine-tuning keeps it); None = what train.objective needs (clm: causal)."""
    classifier_pooling: Literal["cls", "mean"] | None = None
    """What the pooler of a sentence head fine-tuned from this checkpoint reads (config.json's
    classifier_pooling; `bertkit finetune --pooling` overrides it): 'cls' (BERT: the [CLS] state,
    which NSP trains; Hugging Face compatible) or 'mean' (the mean over the tokens; bertkit only).
    None = 'cls' for a new model, model.init_from's own choice when continuing one.
    An MLM-only model's [CLS] state has no objective of its own: on SST-2 from the one-hour recipe,
    mean pooling gave the fine-tuned model half a point more (docs/pretrain-measurements.md)."""
    init_from: str | None = None
    """An HF/bertkit checkpoint folder to continue pre-training from (instead of random init). Its
    shape, activation, norm placement, positions and attention direction are the checkpoint's: a
    model key above that says otherwise is an error, and config.yaml records the checkpoint's
    values. Dropout and classifier_pooling, which change no weight, are applied when given."""
    position_init: Literal["normal", "sinusoidal"] = "normal"
    """How the learned position table starts: 'normal' (BERT: N(0, 0.02)) or 'sinusoidal' (the
    Transformer's sin/cos table scaled to the same std, still learned; a relative offset is then a
    linear map of the table, so attention to neighbours is learned sooner). Init only: the checkpoint
    is a plain BERT either way."""
    position_embedding_type: Literal["absolute", "alibi"] = "absolute"
    """Where word order comes from: 'absolute' (BERT: a learned position table; Hugging Face
    compatible) or 'alibi' (no table; each head's attention falls with distance, slopes 1, 1/2, ...,
    as MosaicBERT; bertkit-only checkpoints). On the quickstart's corpus ALiBi read the neighbours of
    a [MASK] within a few hundred updates where the table had not after thousands:
    docs/pretrain-measurements.md."""
    attention_init: Literal["normal", "neighbours"] = "normal"
    """How the attention starts: 'normal' (BERT) or 'neighbours' (every head starts attending to one
    neighbour, offsets -1, +1, -2, +2 in turn, through a sin/cos position table and matching query/key
    weights; `model.neighbour_attention_`). Init only, all of it learned: the checkpoint is a plain BERT."""


@dataclass
class DataSection:
    path: str = ""
    """Folder written by `bertkit prepare` (phase 1, e.g. length 128). Its tokenizer is used."""
    long_path: str | None = None
    """Prepared data for the paper's second phase (length 512); None = one phase."""
    eval_path: str | None = None
    """Held-out prepared data; None = the held-out documents `prepare` split off (`path`/eval). Data
    prepared without a split falls back on the last `eval_instances` instances of `path`, with a
    warning: they share documents (and with static masks, text) with the training instances."""
    eval_instances: Annotated[int, NON_NEGATIVE] = 256
    """Held-out instances used for periodic evaluation, evenly spread over the held-out set (0 = none)."""
    max_eval_overlap: Annotated[float, UNIT] = 0.5
    """Refuse a held-out set (split or eval_path) when more than this share of its 12-grams of token
    ids also occur in the training data (the paper note's "mask leakage"); above 0.05 a warning.
    The measured share is in the run card (and, for the fallback on training instances, warned)."""
    # Masking. None = exactly as `bertkit prepare` recorded it (--masking_config.*: mode, mask_prob,
    # max_predictions, the 80/10/10 fractions); a value overrides the prepared one
    # (dynamic masking only: static data carries its masks) and the run card lists the override.
    mask_mode: Literal["token", "whole_word", "span"] | None = None
    """Dynamic masking: 'token' (BERT), 'whole_word' or 'span'. New masks every epoch, a pure
    function of (seed, epoch, index)."""
    mask_prob: Annotated[float | None, OPEN_UNIT] = None
    """Share of the maskable tokens selected for prediction."""
    max_predictions: Annotated[int | None, AT_LEAST_1] = None
    """Cap on predictions per sequence (google-research/bert max_predictions_per_seq)."""
    long_max_predictions: Annotated[int | None, AT_LEAST_1] = None
    """The cap in the long phase (None = as `long_path` was prepared)."""
    mask_token_fraction: Annotated[float | None, UNIT] = None
    """Of the selected positions, the share shown as [MASK] (BERT: 0.8)."""
    random_token_fraction: Annotated[float | None, UNIT] = None
    """Of the selected positions, the share shown as a random token (BERT: 0.1); the rest keep theirs."""
    span_p: Annotated[float | None, HALF_OPEN_UNIT] = None
    """Span masking: parameter of the geometric distribution of span lengths in words."""
    max_span: Annotated[int | None, AT_LEAST_1] = None
    """Span masking: longest span in words."""

    def masking_overrides(self, long: bool = False) -> dict:
        """The masking keys given here, as `MaskingConfig` field names (None = as prepared)."""
        given = {"mode": self.mask_mode, "mask_prob": self.mask_prob,
                 "max_predictions": self.long_max_predictions if long else self.max_predictions,
                 "mask_token_fraction": self.mask_token_fraction,
                 "random_token_fraction": self.random_token_fraction, "span_p": self.span_p,
                 "max_span": self.max_span}
        return {k: v for k, v in given.items() if v is not None}


@dataclass
class TrainSection:
    max_steps: Annotated[int, AT_LEAST_1] = 1000
    """Optimizer updates (with a time budget: an upper bound)."""
    budget: str | None = None
    """Wall-time budget such as '30m', '2h', '90s' (Cramming, Geiping & Goldstein 2022): at the start a
    few updates are timed (and undone) and the budget becomes that many updates, the schedule's length;
    the checkpoint and run card record the number, so --resume continues it and --train.max_steps=N
    without a budget reproduces the run exactly. A smaller max_steps ends the run as without a budget."""
    batch_size: Annotated[int, AT_LEAST_1] = 32
    """Sequences per device per micro-batch. Global batch = batch_size x grad_accum x world size."""
    grad_accum: Annotated[int, AT_LEAST_1] = 1
    long_batch_size: Annotated[int | None, AT_LEAST_1] = None
    """Per-device micro-batch of the long phase (None = batch_size // 4)."""
    long_fraction: Annotated[float, PROBABILITY] = 0.1
    """Fraction of the run spent in the long phase when `data.long_path` is set (paper: 0.1)."""
    nsp: bool = True
    """Train the next-sentence-prediction head too (the paper's objective); False = MLM only."""
    objective: Literal["mlm", "clm"] | None = None
    """'mlm' (masked LM: BERT) or 'clm' (next-token prediction under causal attention: the paper's
    "LTR & No NSP" baseline; the MLM head, tied to the word embeddings, is the LM head, so no new
    parameters; no NSP). None = clm when model.causal is true, else mlm."""
    seed: Annotated[int, SEED] = 0
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """'auto' (bf16 autocast on a GPU with bf16, and on a CPU where a bf16 GEMM is measured faster than
    fp32: AMX, AVX512-BF16, measured once per machine; else fp32; a resumed run keeps the precision it ran
    in), 'fp32', 'bf16' or 'fp16' (GPU, with a scaler). Weights stay fp32."""
    attention: Literal["auto", "sdpa", "math"] = "auto"
    """What computes attention while training: 'sdpa' (torch's scaled_dot_product_attention), 'math'
    (the formula written out, `packing.attention`) or 'auto' (SDPA, except on a CPU where the formula is
    measured faster: once per machine; a resumed run keeps the kernel it ran with)."""
    packed: Literal["auto", "true", "false"] = "auto"
    """Padding-free encoder path (real tokens only, `packing.pack`): 'auto' (the CPU: padding-free only
    for data under 75% real tokens and a model wider than 128, else padded, as measured; a GPU: packed
    only where varlen flash attention runs it - bf16/fp16 without attention dropout - else padded,
    measured faster; the run card says which and why), 'true', 'false'."""
    deterministic: bool = False
    """On a GPU, torch's deterministic algorithms (`hardware.deterministic`): the same command gives the
    same weights bit for bit, at some cost in speed; an operation with no deterministic GPU version
    stops the run with torch's error naming it. Off, two GPU runs differ (GPU atomics). The CPU path
    is deterministic either way."""
    compile: bool = False
    """torch.compile the model."""
    clip_norm: Annotated[float, NON_NEGATIVE] = 1.0
    """Global gradient-norm clipping (0 = off)."""
    log_every: Annotated[int, AT_LEAST_1] = 10
    eval_every: Annotated[int, NON_NEGATIVE] = 200
    """Evaluate on the held-out slice every N updates (0 = only at the end)."""
    eval_minutes: Annotated[float, NON_NEGATIVE] = 0.0
    """Also evaluate every this many minutes of training (0 = off); evaluation time is not counted
    as training time (train.budget and the run card's wall time exclude it)."""
    checkpoint_every: Annotated[int, NON_NEGATIVE] = 500
    """Save a checkpoint every N updates (0 = off); one is always saved at the end."""
    checkpoint_minutes: Annotated[float, NON_NEGATIVE] = 0.0
    """Also save when this many minutes passed since the last checkpoint (0 = off)."""
    keep_checkpoints: Annotated[int, AT_LEAST_1] = 2
    """Keep the last K checkpoints."""
    max_bad_steps: Annotated[int, AT_LEAST_1] = 20
    """Stop (with a checkpoint) after this many non-finite losses in a row."""
    distributed: Literal["ddp", "fsdp"] = "ddp"
    """Under torchrun: 'ddp' or 'fsdp' (fully sharded, for large models)."""
    threads: Annotated[int, THREADS] = 0
    """CPU threads for torch (0 = torch's default); the name every command uses (was `num_threads`)."""
    tensorboard: bool = False
    """Also write TensorBoard event files (needs the tensorboard package)."""
    progress: bool = True
    """Show a progress bar (rank 0)."""


@dataclass
class OptimSection:
    optimizer: Literal["adamw", "adamw_google", "lamb"] = "adamw"
    """'adamw', 'adamw_google' (no bias correction, eps 1e-6) or 'lamb' (fine-tuning's `optimizer` too)."""
    lr: Annotated[float, POSITIVE] = 1e-4
    weight_decay: Annotated[float, NON_NEGATIVE] = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: Annotated[float | None, POSITIVE] = None
    """None = 1e-8 for adamw, 1e-6 for adamw_google and lamb."""
    warmup: Annotated[float, NON_NEGATIVE] = 0.01
    """Warm-up: a fraction of the run if < 1 (of steps, or of the time budget), else a number of updates."""
    schedule: Literal["linear", "cosine", "constant", "wsd"] = "linear"
    """'linear' decay to end_lr, 'cosine', 'constant' or 'wsd' (warmup-stable-decay: peak lr until
    the last `decay_fraction` of the run, then linear to end_lr). One-cycle = 'linear' with warmup 0.5."""
    end_lr: Annotated[float, NON_NEGATIVE] = 0.0
    decay_fraction: Annotated[float, UNIT] = 0.2
    """'wsd': the share of the run (steps or time budget) spent decaying."""


@dataclass
class PretrainConfig:
    out: str = "runs/pretrain"
    """Run folder: config.yaml, metrics.jsonl, checkpoints/, run_card.{md,json}, curves.png."""
    resume: bool = False
    """Continue from the latest valid checkpoint in `out` (corrupt ones are skipped)."""
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    train: TrainSection = field(default_factory=TrainSection)
    optim: OptimSection = field(default_factory=OptimSection)

    def __post_init__(self) -> None:
        for section in ("model", "data", "train", "optim"):      # the choices and ranges on the fields
            check_fields(getattr(self, section), section + ".")
        if self.train.budget is not None:
            seconds = parse_duration(self.train.budget, "train.budget")
            if not (math.isfinite(seconds) and seconds > 0):
                raise RunConfigError(f"train.budget must be a positive duration, got {self.train.budget!r}")
        _check_values(self)
        causal, objective = self.model.causal, self.train.objective
        if objective is None:
            self.train.objective = objective = "clm" if causal else "mlm"
        if causal is None:
            self.model.causal = causal = objective == "clm"
        if objective == "clm" and not causal:
            raise RunConfigError("train.objective=clm predicts each next token: it needs causal attention "
                                 "(model.causal=false would show the model the token it must predict)")
        if objective == "mlm" and causal:
            raise RunConfigError("model.causal=true with train.objective=mlm: a left-to-right model is trained on "
                                 "next tokens; set train.objective=clm (the paper's LTR baseline)")


def _check_values(cfg: "PretrainConfig") -> None:
    """Ranges of the model, train and optim numbers (data: DataSection.check), named in the error."""
    m, o = cfg.model, cfg.optim
    if m.preset not in PRESETS:
        raise RunConfigError(not_one_of("model.preset", m.preset, PRESETS))
    if m.hidden_act not in ACTIVATIONS:
        raise RunConfigError(f"model.hidden_act: {m.hidden_act!r} is not one of {', '.join(ACTIVATIONS)}")
    hidden = m.hidden_size or PRESETS[m.preset]["hidden_size"]
    heads = m.num_heads or PRESETS[m.preset]["num_heads"]
    if hidden % heads:
        raise RunConfigError(f"model.hidden_size ({hidden}) must be divisible by model.num_heads ({heads})")
    for key, own in (("position_init", "position table"), ("attention_init", "weights")):
        if m.init_from and getattr(m, key) != "normal":
            raise RunConfigError(f"model.{key} {getattr(m, key)!r} starts a new model; model.init_from "
                                 f"{m.init_from} brings its own {own} (drop one of the two)")
    if m.position_embedding_type == "alibi" and (m.position_init != "normal" or m.attention_init != "normal"):
        raise RunConfigError("model.position_embedding_type 'alibi' has no position table to start: drop "
                             "model.position_init / model.attention_init")
    if m.attention_init == "neighbours" and m.position_init != "normal":
        raise RunConfigError("model.attention_init 'neighbours' sets the position table itself; "
                             f"drop model.position_init {m.position_init!r}")
    if not all(0 <= b < 1 for b in o.betas):
        raise RunConfigError(f"optim.betas must be two numbers in [0, 1), got {list(o.betas)}")
    if o.end_lr > o.lr:
        raise RunConfigError(f"optim.end_lr ({o.end_lr}) must not exceed optim.lr ({o.lr})")
    if o.warmup >= 1 and cfg.train.budget is None and o.warmup > cfg.train.max_steps:
        raise RunConfigError(f"optim.warmup is {o.warmup:g} updates, longer than the run (train.max_steps "
                             f"{cfg.train.max_steps}); give a fraction (< 1) or fewer updates")


# ---- loading, overriding, saving ---------------------------------------------------------------
def parse_duration(text: str | float, key: str = "duration") -> float:
    """'30m' -> 1800.0 seconds; accepts s, m, h and combinations ('1h30m'); a bare number is seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([smh]?)", str(text).strip().lower())
    if not parts or re.sub(r"[\d.\s smh]", "", str(text).lower()):
        raise RunConfigError(f"{key}: cannot read {text!r} as a duration (use e.g. 90s, 30m, 2h)")
    return sum(float(n) * {"": 1, "s": 1, "m": 60, "h": 3600}[u] for n, u in parts)


def read_yaml_mapping(path: str | Path, what: str = "keys") -> dict:
    """A config file's top-level mapping (values only: yaml.safe_load), or one error naming the file:
    missing, a folder, not UTF-8, not YAML, nested too deeply, or not a mapping."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise RunConfigError(f"{path}: no such config file") from None
    except IsADirectoryError:
        raise RunConfigError(f"{path}: is a directory, not a config file") from None
    except UnicodeDecodeError as e:
        raise RunConfigError(f"{path}: not valid UTF-8 text (byte {e.start})") from None
    except RecursionError:
        raise RunConfigError(f"{path}: not valid YAML (nested too deeply)") from None
    except yaml.YAMLError as e:
        raise RunConfigError(f"{path}: not valid YAML ({first_line(e)})") from None
    if not isinstance(data, dict):
        raise RunConfigError(f"{path}: expected a mapping of {what} at the top level")
    return data


def load_config(cls: type, path: str | Path | None = None, overrides: list[str] | None = None,
                values: dict | None = None):
    """Build `cls` from a YAML file (optional), then nested `values` (what `cliconfig.given` returns
    for the options typed) and `--section.key=value` override strings, applied last."""
    data: dict[str, Any] = {}
    source = "options"
    if path is not None:
        source = str(path) + (" + options" if overrides or values else "")
        data = read_yaml_mapping(path, "sections")
    data = merge(data, values or {})
    for item in overrides or []:
        key, value = parse_override(item)
        node = data
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise RunConfigError(f"{item}: {part!r} is a value, not a section")
        node[last] = value
    return from_dict(cls, data, source)


def merge(a: dict, b: dict) -> dict:
    """b over a, section by section (copies: neither is changed)."""
    out = copy.deepcopy(a)
    for k, v in (b or {}).items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def parse_override(item: str) -> tuple[str, Any]:
    """'--train.max_steps=20' -> ('train.max_steps', 20); the value is read as YAML."""
    m = re.fullmatch(r"--?([A-Za-z_][\w.]*)=(.*)", item, re.S)
    if not m:
        raise RunConfigError(f"cannot read option {item!r}; write overrides as --section.key=value")
    return m.group(1), yaml_value(m.group(2))


def yaml_value(text: str) -> Any:
    """A value typed as text (an override, a command-line option) as YAML reads it, as config files are
    read; unreadable text as is."""
    import yaml

    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


# Keys renamed for one name per setting: the old spelling is the one-line error "X is now Y".
MOVED = {"train.num_threads": "train.threads", "max_seq_length": "max_length",     # Google's name, HF run_glue's
         "prepare.max_seq_length": "prepare.max_length", "optim.name": "optim.optimizer",
         "probe_layers": "probe_features (concat_last_K)"}


def moved(cls: type, prefix: str = "") -> dict[str, str]:
    """The entries of MOVED whose replacement is a field of `cls` (keys below `prefix`, without it)."""
    out = {}
    for old, new in MOVED.items():
        if not (old.startswith(prefix) and new.startswith(prefix)):
            continue
        kind, *path, leaf = [cls, *new.split()[0].removeprefix(prefix).split(".")]
        for part in path:
            kind = typing.get_type_hints(kind).get(part) if dataclasses.is_dataclass(kind) else None
        if dataclasses.is_dataclass(kind) and leaf in {f.name for f in fields(kind)}:
            out[old.removeprefix(prefix)] = new
    return out


def unknown_key(key: str, known: list[str], where: str, what: str = "key") -> str:
    """The error for a `what` (a key, an arm) not in `known`: the closest known one, else all of them."""
    close = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.5)
    return f"{where}: unknown {what} {key!r}" + (f"; did you mean {close[0]!r}?" if close else
                                               f"; known: {', '.join(known)}")


def from_dict(cls: type, data: dict, source: str = "config", prefix: str = ""):
    """A dataclass from nested dicts, checking every key and type."""
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in known and key in moved(cls, prefix):
            raise RunConfigError(f"{source}: {prefix}{key} is now {MOVED[prefix + key]}")
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.5)
            if not close and not prefix:  # a bare key may belong to a section: 'max_steps' -> train.max_steps
                close = [f"{f.name}.{k}" for f in fields(cls) if dataclasses.is_dataclass(hints[f.name])
                         for k in difflib.get_close_matches(str(key), [g.name for g in fields(hints[f.name])],
                                                            n=1, cutoff=0.8)][:1]
            hint = f"; did you mean {(close[0] if '.' in close[0] else prefix + close[0])!r}?" if close else f"; known: {', '.join(known)}"
            raise RunConfigError(f"{source}: unknown key {prefix + key!r}{hint}")
        kind = hints[key]
        if dataclasses.is_dataclass(kind):
            if not isinstance(value, dict):
                raise RunConfigError(f"{source}: {prefix}{key} is a section; give it keys, not {value!r}")
            kwargs[key] = from_dict(kind, value, source, f"{prefix}{key}.")
        else:
            kwargs[key] = _coerce(value, kind, f"{source}: {prefix}{key}")
    try:
        return cls(**kwargs)
    except RunConfigError as e:                 # a section's own check names the key below its section
        raise RunConfigError(f"{source}: {prefix}{e}") from None


def _coerce(value: Any, kind: Any, where: str) -> Any:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, where)
            except RunConfigError as e:
                errors.append(str(e))
        raise RunConfigError(errors[0])          # the first arm's complaint
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise RunConfigError(f"{where}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, where) for v, a in zip(value, args))
    if kind is Any:
        return value
    if origin is typing.Literal:
        for choice in args:
            if value == choice and type(value) is type(choice):
                return choice
        if isinstance(value, bool) and str(value).lower() in args:      # packed: false -> 'false'
            return str(value).lower()
        raise RunConfigError(not_one_of(where, value, args))
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise RunConfigError(f"{where}: expected true or false, got {value!r}")
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind is float and isinstance(value, str):          # YAML 1.1 reads '1e-3' as a string
        try:
            return float(value)
        except ValueError:
            pass
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is str and isinstance(value, (str, int, float)):
        return str(value).lower() if isinstance(value, bool) else str(value)      # packed: true -> 'true'
    raise RunConfigError(f"{where}: expected {getattr(kind, '__name__', kind)}, got {value!r}")


def to_dict(cfg) -> dict:
    return _listify(dataclasses.asdict(cfg))


def _listify(x):
    if isinstance(x, dict):
        return {k: _listify(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_listify(v) for v in x]
    return x


def save_config(cfg, path: str | Path) -> None:
    """Write the resolved config as YAML (loadable again with `load_config`)."""
    import yaml

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))
