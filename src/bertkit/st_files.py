"""sentence-transformers' files around a checkpoint folder: the pooling a folder asks for, and the
files that make a bertkit encoder load in `SentenceTransformer(path)` with the same vectors.

Read (`sentence_transformers_pooling`): modules.json, its Pooling module's config.json in either
layout (sentence-transformers 2 to 5: `pooling_mode_cls_token`, `pooling_mode_mean_tokens`, ...
booleans; 6: `"pooling_mode": "cls"`), and whether a Normalize module follows. Write
(`write_sentence_transformers`): the 2.x layout, which every release since reads: modules.json
(Transformer at the folder's root, Pooling in 1_Pooling/), 1_Pooling/config.json,
sentence_bert_config.json (max_seq_length, which `infer.Predictor` also reads as its limit) and
config_sentence_transformers.json (cosine similarity). No Normalize module is written, so
`SentenceTransformer(path).encode` gives what `bertkit embed` gives (unit length with --normalize).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger("bertkit")

POOLING_DIR = "1_Pooling"


def sentence_transformers_pooling(path: str | Path) -> tuple[str, bool]:
    """(pooling, normalize) of a sentence-transformers checkpoint folder (modules.json,
    1_Pooling/config.json, a Normalize module), else ("mean", False). A pooling the Predictor
    lacks (max, mean of sqrt length, ...) is logged and replaced by mean."""
    path = Path(path)
    try:
        modules = json.loads((path / "modules.json").read_text(encoding="utf-8"))
        types = {m.get("type", "").rsplit(".", 1)[-1]: m.get("path", "") for m in modules}
    except (OSError, ValueError, AttributeError, TypeError):
        return "mean", False
    pooling = "mean"
    if "Pooling" in types:
        try:
            cfg = json.loads((path / types["Pooling"] / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            cfg = {}
        cfg = cfg if isinstance(cfg, dict) else {}
        if isinstance(cfg.get("pooling_mode"), str):                     # sentence-transformers 6
            modes = [cfg["pooling_mode"]]
        else:
            modes = [k[len("pooling_mode_"):].replace("cls_token", "cls").replace("mean_tokens", "mean")
                     for k, v in cfg.items() if k.startswith("pooling_mode_") and v is True]
        if modes == ["cls"]:
            pooling = "cls"
        elif modes not in ([], ["mean"]):
            log.warning("%s: sentence-transformers pooling %s is not supported; embeddings use mean pooling",
                        path, "+".join(modes))
    return pooling, "Normalize" in types


def max_seq_length(path: str | Path, positions: int, default: int | None = None) -> int:
    """The checkpoint's sentence-transformers max_seq_length (sentence_bert_config.json), else `default`
    (None: `positions`); never more than its `positions` embeddings."""
    try:
        n = int(json.loads((Path(path) / "sentence_bert_config.json").read_text(encoding="utf-8"))["max_seq_length"])
    except (OSError, ValueError, KeyError, TypeError):
        n = positions if default is None else default
    return min(n, positions)


def write_sentence_transformers(out: str | Path, pooling: str, hidden_size: int, max_length: int) -> None:
    """The sentence-transformers files (2.x layout) next to a saved encoder in `out`."""
    if pooling not in ("mean", "cls"):
        raise ValueError(f"sentence-transformers pooling must be mean or cls, not {pooling!r}")
    out = Path(out)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": POOLING_DIR, "type": "sentence_transformers.models.Pooling"}]
    pool = {"word_embedding_dimension": hidden_size, "pooling_mode_cls_token": pooling == "cls",
            "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False}
    (out / POOLING_DIR).mkdir(parents=True, exist_ok=True)
    _write(out / "modules.json", modules)
    _write(out / POOLING_DIR / "config.json", pool)
    _write(out / "sentence_bert_config.json", {"max_seq_length": max_length, "do_lower_case": False})
    _write(out / "config_sentence_transformers.json", {"similarity_fn_name": "cosine"})


def _write(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
