"""`bertkit convert`: Google's original TensorFlow BERT checkpoints to a bertkit / Hugging Face folder,
without TensorFlow.

The input is what google-research/bert (and the first BioBERT and SciBERT releases) ship:

    bert_model.ckpt.index, bert_model.ckpt.data-00000-of-00001   the weights (tensor bundle: tfckpt.py)
    bert_config.json                                              the sizes
    vocab.txt                                                     the WordPiece vocabulary

The output is a folder every bertkit command and transformers' `BertForPreTraining` load:
config.json, model.safetensors (the encoder with its pooler, the MLM and NSP heads) and the
tokenizer files. Weights go Google name -> Hugging Face name -> bertkit name in the checkpoint package's one
table; Adam's slots and the step counter are left out.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import BertConfig, ConfigError
from ..outdir import staged_dir
from ..sources import read_json_object
from ..tokenizer import Tokenizer, read_vocab
from . import ARCHITECTURES, GOOGLE_OPTIMIZER_STATE, CheckpointError, check_config_json, from_google, \
    heads_in, save_model
from .tfckpt import Checkpoint

# the keys of Google's bert_config.json that fix the weights' shapes (the rest have defaults)
GOOGLE_CONFIG_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                      "intermediate_size", "max_position_embeddings", "type_vocab_size")


@dataclass
class ConvertOptions:
    """How `convert` reads the checkpoint (the flags of `bertkit convert`)."""
    do_lower_case: bool | None = None
    """The tokenizer lower-cases (and strips accents), as Google's --do_lower_case (default: inferred from
    the vocabulary: uncased ones have no upper-case tokens)."""
    verify: bool = True
    """Check the tensors' CRC-32C checksums (the slow part: seconds per 100 MB)."""


@dataclass
class Converted:
    """What `convert` read and wrote (the command prints it)."""
    prefix: Path
    out: Path
    architecture: str
    heads: list[str]
    weights: int                     # tensors converted
    left_out: int                    # optimizer slots and counters
    parameters: int
    config: dict
    vocab_size: int
    lowercase: bool
    lowercase_why: str
    verified: bool
    files: list[str] = field(default_factory=list)


def find_checkpoint(source: str | Path) -> tuple[Path, Path]:
    """(checkpoint prefix, the folder holding bert_config.json and vocab.txt) of a release folder or
    of a prefix such as DIR/model.ckpt-100000."""
    source = Path(source)
    if source.is_dir():
        indexes = sorted(source.glob("*.index"))
        if source / "bert_model.ckpt.index" in indexes:      # Google's name: taken where a folder holds several
            indexes = [source / "bert_model.ckpt.index"]
        if not indexes:
            raise CheckpointError(f"{source}: no TensorFlow checkpoint here (no *.index file)")
        if len(indexes) > 1:
            names = ", ".join(i.stem for i in indexes[:5])
            raise CheckpointError(f"{source}: holds {len(indexes)} checkpoints ({names}); give one as {source}/NAME")
        return indexes[0].with_suffix(""), source
    if source.suffix == ".index" and source.is_file():
        return source.with_suffix(""), source.parent
    if Path(f"{source}.index").is_file():
        return source, source.parent
    raise CheckpointError(f"{source}: no such folder or TensorFlow checkpoint (looked for {source}.index)")


def read_google_config(f: Path) -> BertConfig:
    """BertConfig from Google's bert_config.json: the shape keys must be there, every key well-typed."""
    if not f.is_file():
        raise CheckpointError(f"{f}: no such file (Google's releases put bert_config.json beside the checkpoint)")
    raw = read_json_object(f, CheckpointError)
    check_config_json(raw, f)
    missing = [k for k in GOOGLE_CONFIG_KEYS if k not in raw]
    if missing:
        raise CheckpointError(f"{f}: missing \"{missing[0]}\"" + (f" (and {', '.join(missing[1:])})" if missing[1:]
                                                                   else "") + "; a bert_config.json gives every size")
    try:
        return BertConfig.from_hf_dict(raw, source=str(f))
    except ConfigError as e:
        raise CheckpointError(str(e)) from None


def infer_lowercase(vocab: dict[str, int]) -> tuple[bool, str]:
    """Whether a vocabulary was built from lower-cased text: an uncased vocabulary has no upper-case
    tokens (besides [CLS]-style specials), a cased one thousands."""
    words = [t for t in vocab if not (t.startswith("[") and t.endswith("]"))]
    upper = sum(1 for t in words if any(c.isupper() for c in t))
    uncased = upper * 200 < max(len(words), 1)          # under 0.5%
    return uncased, f"inferred: {upper} of {len(words)} vocabulary tokens have upper-case letters"


def read_weights(ckpt: Checkpoint, verify: bool = True, progress: bool = True) -> tuple[dict[str, torch.Tensor], int]:
    """The checkpoint's tensors as float32 by their TF names, optimizer state left out (and counted)."""
    from tqdm import tqdm

    names = [n for n in ckpt.names() if not GOOGLE_OPTIMIZER_STATE.search(n)]
    total = sum(ckpt.entry(n).size for n in names)
    out: dict[str, torch.Tensor] = {}
    with tqdm(total=total, unit="B", unit_scale=True, desc="convert", disable=None if progress else True,
              leave=False) as bar:
        for n in names:
            out[n] = torch.from_numpy(ckpt.read(n, verify=verify)).float()
            bar.update(ckpt.entry(n).size)
    return out, len(ckpt.names()) - len(names)


def is_checkpoint_folder(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "model.safetensors").is_file()


def convert(source: str | Path, out: str | Path, options: ConvertOptions | None = None,
            progress: bool = True) -> Converted:
    """Convert a Google TF checkpoint (a release folder or a prefix) into the folder `out`."""
    o = options or ConvertOptions()
    lowercase, verify = o.do_lower_case, o.verify
    prefix, folder = find_checkpoint(source)
    cfg = read_google_config(folder / "bert_config.json")
    vocab_file = folder / "vocab.txt"
    if not vocab_file.is_file():
        raise CheckpointError(f"{vocab_file}: no such file (Google's releases put vocab.txt beside the checkpoint)")
    vocab = read_vocab(vocab_file)
    tokens = max(vocab.values()) + 1
    if tokens > cfg.vocab_size:
        raise CheckpointError(f"{vocab_file}: {tokens} tokens but bert_config.json's vocab_size is {cfg.vocab_size}")
    why = "given"
    if lowercase is None:
        lowercase, why = infer_lowercase(vocab)
    ckpt = Checkpoint(prefix)
    ckpt.check_shards()
    tensors, left_out = read_weights(ckpt, verify, progress)
    model = from_google(tensors, cfg, prefix)
    del tensors
    head = getattr(model, "head", "encoder")
    with staged_dir(out, owned=is_checkpoint_folder, what="checkpoint") as tmp:
        Tokenizer(vocab, lowercase=lowercase, name=str(vocab_file)).save(tmp)
        save_model(model, tmp)                    # last: config.json marks a complete folder
        files = sorted(p.name for p in tmp.iterdir() if not p.name.startswith("."))
    names = {n for n, _ in model.named_parameters()}
    return Converted(prefix=prefix, out=Path(out), architecture=ARCHITECTURES[head], heads=heads_in(names),
                     weights=len(ckpt.names()) - left_out, left_out=left_out,
                     parameters=sum(p.numel() for p in model.parameters()), config=cfg.to_hf_dict(),
                     vocab_size=tokens, lowercase=lowercase, lowercase_why=why,
                     verified=verify, files=files)
