"""`bertkit ablate`'s configuration: the grid (`AblateConfig`), its arms (`Arm`, `Budget`), reading
and checking a grid file, selecting arms, and the small helpers the grid and its report share
(describing an arm, JSON files written whole). The runs are arm.py and grid.py,
the statistics and the report report.py."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Sequence

from ..errors import BertkitError
from ..outdir import write_whole
from ..runconfig import (AT_LEAST_1, SEED, THREADS, _coerce, check_fields, parse_duration, read_yaml_mapping,
                         unknown_key)


# ---- configuration ------------------------------------------------------------------------------
@dataclass
class Budget:
    """What every arm gets, unless the arm's own `budget` changes it (the data/steps axis)."""
    match: Literal["tokens", "time", "flops"] = "tokens"
    """'tokens': the same updates x global batch x sequence length for every arm (wall time is
    recorded); 'time': the same pre-training wall time (tokens are recorded); 'flops': the same
    training FLOPs as the base arm's `steps` updates (an analytic count per update, never timed:
    `ablate.update_flops`), so a costlier update gets fewer of them. An arm may set its own match."""
    steps: Annotated[int, AT_LEAST_1] = 1000
    """Updates per arm when matching tokens; the base arm's updates when matching FLOPs."""
    time: str | None = None
    """Pre-training wall time per arm when matching time ('3m', '90s')."""

    def __post_init__(self) -> None:
        check_fields(self, "budget.")
        if self.time is not None and not 0 < parse_duration(self.time, "budget.time") < float("inf"):
            raise BertkitError(f"budget.time must be a positive duration, got {self.time!r}")


@dataclass
class Arm:
    name: str
    setting: str = ""
    """The one setting this arm changes, in words (default: written from the overrides)."""
    pretrained: bool = True
    """False: no pre-training, the fine-tuning encoder is a random initialisation of the same shape."""
    model_from: str | None = None
    """Reuse the pre-trained model of this (earlier) arm: e.g. frozen probes of the base model."""
    checkpoint: int | None = None
    """With model_from: fine-tune the source's pre-training as it was after this many updates (the
    paper's Figure 5: one run read at k steps; the source keeps those checkpoints' models)."""
    corpus_fraction: float = 1.0
    """Pre-train on this share of the training documents (a fixed random subset; smaller is nested)."""
    prepare: dict = field(default_factory=dict)
    """PrepareConfig keys over the base's."""
    pretrain: dict = field(default_factory=dict)
    """PretrainConfig sections over the base's: {model: {...}, data: {...}, train: {...}, optim: {...}}."""
    finetune: dict = field(default_factory=dict)
    """FinetuneConfig keys over the base's, for every task."""
    budget: dict = field(default_factory=dict)
    """Budget keys over the grid's (match / steps / time): e.g. {match: flops} for the base arm's
    compute where the grid matches tokens."""
    lr_search: dict = field(default_factory=dict)
    """lr_search keys over the grid's (e.g. other candidate rates for a probe; {lrs: []}: no search)."""
    probe: dict = field(default_factory=dict)
    """Logistic-regression probes of the arm's frozen model instead of fine-tuning (`bertkit.linear_probe`:
    L-BFGS to convergence, C by cross-validation, deterministic: one row per task x feature x pooling,
    seed 0): {features: [...], pooling: [cls, mean], C: [...], folds: 5}; empty: fine-tune."""
    error: str | None = None
    """A problem found when reading the arm (it becomes a failed row, the grid goes on)."""


@dataclass
class AblateConfig:
    out: str = "runs/ablate"
    data_dir: str = "../shared/data"
    """Folder of the pre-training text and the task data (relative paths below are inside it)."""
    corpus: list = field(default_factory=lambda: ["pretrain/wiki_vital_leads.txt.gz"])
    """Pre-training text files: one sentence per line, a blank line between documents."""
    eval_documents: Annotated[int, AT_LEAST_1] = 200
    """Documents held out (the same for every arm): held-out MLM accuracy is measured on them."""
    split_seed: Annotated[int, SEED] = 0
    tokenizer: dict = field(default_factory=lambda: {"vocab_size": 8000})
    """Tokenizer.train keys: vocab_size, lowercase, min_frequency."""
    prepare: dict = field(default_factory=dict)
    pretrain: dict = field(default_factory=dict)
    finetune: dict = field(default_factory=dict)
    tasks: dict = field(default_factory=dict)
    """name -> {data: folder inside data_dir, FinetuneConfig keys for this task (train_limit, ...)}."""
    seeds: list = field(default_factory=lambda: [0, 1, 2])
    lr_search: dict = field(default_factory=dict)
    """Fine-tuning's learning rate chosen on the dev set, per arm x task (the paper picks its rate on
    dev): {lrs: [2.0e-4, 5.0e-4, 1.0e-3], seeds: first}. Every candidate runs at the first seed
    ('first') or at every seed ('all'); the rate with the best dev mean is kept and every seed is
    reported at it (each candidate's score is a row of results.jsonl). Empty: finetune.lr for every
    run. An arm whose own finetune sets lr keeps that rate."""
    budget: Budget = field(default_factory=Budget)
    mlm_eval_instances: Annotated[int, AT_LEAST_1] = 512
    """Held-out instances for the fixed MLM protocol (token masking, 15%, 80/10/10, same positions)."""
    blimp: dict = field(default_factory=dict)
    """BLiMP zero-shot scoring of every arm's model (`bertkit blimp`): {data: file or folder inside data_dir,
    limit: first N pairs of each paradigm (null: all), method: auto | pll | pll-word-l2r}; empty: not scored."""
    base_arm: str = "base"
    threads: Annotated[int, THREADS] = 0
    """torch CPU threads for every run (0 = torch's default; with jobs > 1: cores / jobs)."""
    jobs: Annotated[int, AT_LEAST_1] = 1
    """Arms run in this many processes at once (`--jobs` overrides): on a small CPU, one process per
    core with one thread each beats one process with many threads on these small models."""
    keep_models: bool = False
    """Keep fine-tuned weights (off: only metrics and run cards stay; pre-trained models always stay)."""
    arms: list = field(default_factory=list)
    source: str = ""

    def __post_init__(self) -> None:
        check_fields(self)
        if not isinstance(self.corpus, list) or not all(isinstance(f, str) and f for f in self.corpus):
            raise BertkitError(f"corpus must be a list of file names, got {self.corpus!r}")
        if not isinstance(self.blimp, dict) or set(self.blimp) - {"data", "limit", "method"} or (
                self.blimp and not isinstance(self.blimp.get("data"), str)):
            raise BertkitError(f"blimp takes data (a file or folder of BLiMP pairs), limit and method, got {self.blimp!r}")
        if self.blimp.get("limit") is not None and (type(self.blimp["limit"]) is not int or self.blimp["limit"] < 1):
            raise BertkitError(f"blimp.limit must be an integer >= 1 or null, got {self.blimp['limit']!r}")
        if not isinstance(self.seeds, list):
            raise BertkitError(f"seeds must be a list of integers, got {self.seeds!r}")
        for i, seed in enumerate(self.seeds):
            if type(seed) is not int or SEED.problem(seed):
                raise BertkitError(f"seeds[{i}] must be an integer in [0, 2**32 - 1], got {seed!r}")


TOP_KEYS = [f.name for f in dataclasses.fields(AblateConfig) if f.name != "source"]
ARM_KEYS = [f.name for f in dataclasses.fields(Arm) if f.name != "error"]


def load_ablate_config(path: str | Path, values: dict | None = None) -> AblateConfig:
    """The grid from YAML, then `values` (grid keys given as options) on top. Grid-level mistakes are
    errors now; an arm's mistakes become its failed row."""
    path = Path(path)
    raw = read_yaml_mapping(path, "grid keys")
    for key in raw:
        if key not in TOP_KEYS:
            raise BertkitError(unknown_key(key, TOP_KEYS, str(path)))
    kw: dict[str, Any] = {**raw, **(values or {})}
    for key in ("tokenizer", "prepare", "pretrain", "finetune", "tasks", "lr_search"):
        if not isinstance(kw.get(key, {}), dict):
            raise BertkitError(f"{path}: {key} must be a mapping")
    bad = _not_sections(kw.get("pretrain", {}), "pretrain") or next(
        (f"tasks.{t} must be a mapping of FinetuneConfig keys (data: ...), not {v!r}"
         for t, v in kw.get("tasks", {}).items() if v is not None and not isinstance(v, dict)), None)
    bad = bad or lr_search_problem(kw.get("lr_search") or {}, "lr_search")
    if bad:
        raise BertkitError(f"{path}: {bad}")
    budget = kw.pop("budget", {}) or {}
    if not isinstance(budget, dict) or set(budget) - {"match", "steps", "time"}:
        raise BertkitError(f"{path}: budget takes match, steps and time")
    arms = kw.pop("arms", []) or []
    if not isinstance(arms, list):
        raise BertkitError(f"{path}: arms must be a list of mappings (- name: ...)")
    try:
        kw = _typed(AblateConfig, kw, "")
        cfg = AblateConfig(**kw, budget=Budget(**_typed(Budget, budget, "budget.")), source=str(path))
    except BertkitError as e:
        raise BertkitError(f"{path}{' + options' if values else ''}: {e}") from None
    cfg.arms = [_read_arm(a, i, str(path)) for i, a in enumerate(arms)]
    _check_grid(cfg)
    return cfg


def _typed(cls: type, values: dict, prefix: str) -> dict:
    """`values` with each number, string and switch checked against its field's type (as YAML
    values of a run config are: `runconfig._coerce`); lists and mappings are checked where used."""
    hints = typing.get_type_hints(cls)
    return {k: _coerce(v, hints[k], f"{prefix}{k}") if hints[k] in (int, float, str, bool, str | None) else v
            for k, v in values.items()}


def _not_sections(pretrain: dict, where: str) -> str | None:
    """What is wrong when a PretrainConfig section (model, data, train, optim) is given a value, not keys:
    merged with the grid's own train keys it would be dropped without a word."""
    for k, v in pretrain.items():
        if k in ("model", "data", "train", "optim") and not isinstance(v, dict):
            return f"{where}.{k} is a section; give it keys, not {v!r}"
    return None


def _read_arm(raw: Any, i: int, where: str) -> Arm:
    if not isinstance(raw, dict) or "name" not in raw:
        raise BertkitError(f"{where}: arms[{i}] needs a name (arms are mappings: - name: ...)")
    arm = Arm(name=str(raw["name"]))
    for key, value in raw.items():
        if key not in ARM_KEYS:
            arm.error = unknown_key(key, ARM_KEYS, f"{where} arm {arm.name}")
            continue
        if key in ("prepare", "pretrain", "finetune", "budget", "lr_search") and not isinstance(value, dict):
            arm.error = f"{where} arm {arm.name}: {key} must be a mapping of keys, not {value!r}"
            continue
        if key == "pretrain" and (problem := _not_sections(value, "pretrain")):
            arm.error = f"{where} arm {arm.name}: {problem}"
            continue
        setattr(arm, key, value)
    if not 0 < float(arm.corpus_fraction) <= 1:
        arm.error = f"{where} arm {arm.name}: corpus_fraction must be in (0, 1]"
    if set(arm.budget) - {"match", "steps", "time"}:
        arm.error = f"{where} arm {arm.name}: budget takes match, steps and time"
    elif arm.budget.get("match", "tokens") not in MATCHES:
        arm.error = f"{where} arm {arm.name}: budget.match must be one of {', '.join(MATCHES)}"
    if problem := lr_search_problem(arm.lr_search, "lr_search"):
        arm.error = f"{where} arm {arm.name}: {problem}"
    if "probe" in raw:
        from ..linear_probe import probe_spec
        try:
            probe_spec(arm.probe, f"{where} arm {arm.name}: probe")
        except BertkitError as e:
            arm.error = str(e)
    if arm.checkpoint is not None and (not arm.model_from or not isinstance(arm.checkpoint, int)
                                       or isinstance(arm.checkpoint, bool) or arm.checkpoint < 1):
        arm.error = f"{where} arm {arm.name}: checkpoint must be an update number >= 1, with model_from"
    return arm


def _check_grid(cfg: AblateConfig) -> None:
    src = cfg.source
    names = [a.name for a in cfg.arms]
    if not names:
        raise BertkitError(f"{src}: no arms")
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise BertkitError(f"{src}: arm names must be unique ({', '.join(dup)} repeated)")
    if cfg.base_arm not in names:
        raise BertkitError(f"{src}: base_arm {cfg.base_arm!r} is not one of the arms")
    if cfg.budget.match == "time" and not cfg.budget.time:
        raise BertkitError(f"{src}: budget.match 'time' needs budget.time (e.g. 3m)")
    if not cfg.tasks:
        raise BertkitError(f"{src}: no tasks (e.g. tasks: {{sst2: {{data: glue/SST-2}}}})")
    if len(cfg.seeds) < 2:
        raise BertkitError(f"{src}: give at least 2 seeds (3 or more to see fine-tuning variance)")
    for i, arm in enumerate(cfg.arms):
        if arm.model_from is not None and arm.model_from not in names[:i]:
            raise BertkitError(f"{src}: arm {arm.name}: model_from {arm.model_from!r} must name an earlier arm")


MATCHES = typing.get_args(typing.get_type_hints(Budget)["match"])   # the Literal on the field


def lr_search_problem(search: Any, where: str) -> str | None:
    """What is wrong with an lr_search mapping ({lrs: [...], seeds: first|all}), or None."""
    if not isinstance(search, dict):
        return f"{where} must be a mapping ({{lrs: [2.0e-4, 5.0e-4], seeds: first}}), not {search!r}"
    if set(search) - {"lrs", "seeds"}:
        return unknown_key(sorted(set(search) - {"lrs", "seeds"})[0], ["lrs", "seeds"], where)
    lrs = search.get("lrs", [])
    if not isinstance(lrs, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                            and 0 < x < float("inf") for x in lrs):
        return f"{where}.lrs must be a list of positive learning rates, got {lrs!r}"
    if len(set(lrs)) != len(lrs):
        return f"{where}.lrs repeats a rate: {lrs!r}"
    if search.get("seeds", "first") not in ("first", "all"):
        return f"{where}.seeds must be 'first' or 'all', not {search.get('seeds')!r}"
    return None


def lr_search_of(cfg: AblateConfig, arm: Arm) -> dict | None:
    """The arm's learning-rate search ({lrs, seeds}), or None: no search configured, `lrs: []`, the
    arm fixes its own finetune lr, or it is a probe arm (logistic regression has no learning rate)."""
    search = {**cfg.lr_search, **arm.lr_search}
    if not search.get("lrs") or "lr" in arm.finetune or arm.probe:
        return None
    return {"lrs": [float(x) for x in search["lrs"]], "seeds": search.get("seeds", "first")}


def select_arms(cfg: AblateConfig, names: Sequence[str] | None = None, shard: str | None = None) -> list[Arm]:
    """The arms this process runs: all, the named ones, or shard I of N (arms reusing another arm's
    model stay with it, so every shard can run what it holds)."""
    arms = list(cfg.arms)
    if names:
        known = {a.name for a in arms}
        for n in names:
            if n not in known:
                raise BertkitError(unknown_key(n, sorted(known), "--arms", "arm"))
        arms = [a for a in arms if a.name in set(names)]
    if shard:
        i, n = _parse_shard(shard)
        groups = list(dict.fromkeys(_root(cfg, a) for a in cfg.arms))
        mine = {g for k, g in enumerate(groups) if k % n == i}
        arms = [a for a in arms if _root(cfg, a) in mine]
    return arms


def _root(cfg: AblateConfig, arm: Arm) -> str:
    by = {a.name: a for a in cfg.arms}
    while arm.model_from is not None:
        arm = by[arm.model_from]
    return arm.name


def _parse_shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise BertkitError(f"--shard {text!r}: write I/N, e.g. 0/2 (the first of two machines)") from None
    if not 0 <= i < n:
        raise BertkitError(f"--shard {text}: I must be in 0..N-1")
    return i, n


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def describe(arm: Arm) -> str:
    """The arm's setting in words: its own text, or its overrides."""
    if arm.setting:
        return arm.setting
    parts = []
    if not arm.pretrained:
        parts.append("no pre-training (random init, same shape)")
    if arm.model_from:
        parts.append(f"model of arm {arm.model_from}" + (f" after {arm.checkpoint} updates" if arm.checkpoint else ""))
    if arm.corpus_fraction != 1:
        parts.append(f"{arm.corpus_fraction:g} of the text")
    for section in ("prepare", "pretrain", "finetune", "budget", "lr_search", "probe"):
        parts += [f"{section} {k}={v}" for k, v in flatten(getattr(arm, section)).items()]
    return "; ".join(parts) or "the base recipe"


def _key(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, json.dumps(obj, indent=1, default=str) + "\n")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
