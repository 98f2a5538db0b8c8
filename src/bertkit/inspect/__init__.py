"""`bertkit inspect`: look inside a model on one sentence (pair).

What it measures, all on the user's own text:
  * attention probabilities of every layer and head, recomputed from each layer's weights by the
    formula written out (`explicit_attention`): the model itself runs SDPA or padding-free kernels
    that never form the (T, T) matrix. The recomputation is checked: the encoder run with it gives
    every layer's output of the ordinary run (`Trace.max_diff`), and its rows sum to 1;
  * where the summary position looks: [CLS]'s attention per layer (the last token's under a causal
    mask, the only one that has seen the whole input) and its mass on [CLS] / [SEP] / words;
  * the segment-change test (the paper note's minimal implementation test): replace the right-hand
    segment and measure, per layer, how much each left-segment token's state moved (relative L2);
    under a causal mask the left tokens cannot move (up to rounding), under BERT's they do;
  * with an MLM head: the top predictions at each [MASK], and what greedy left-to-right generation
    with it gives (append [MASK], take the argmax, repeat). A causal checkpoint generates with its
    next-token head instead.
`inspect/report.py` turns the result into figures and an HTML page; the server's /v1/inspect
answers the same numbers as JSON.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Iterator

import torch
from torch import Tensor, nn

from ..checkpoint import load_model, model_folder
from ..errors import BertkitError
from ..model import BertModel, SelfAttention
from ..packing import alibi_bias
from ..runconfig import AT_LEAST_1, THREADS, Checked, Rule
from ..tokenizer import Tokenizer


class InspectError(BertkitError, ValueError):
    """Bad input to `bertkit inspect` (no model, empty text, text longer than the model's positions)."""


@dataclass
class InspectOptions(Checked):
    """What `inspect` measures and shows (the flags of `bertkit inspect`: `cliconfig.add_options`)."""
    layer: int | None = None
    """Whose full attention maps to keep and draw, 1-based (default: the last layer)."""
    replace: str | None = None
    """Also replace the right segment by this sentence (besides [MASK]s and a shuffled copy)."""
    steps: Annotated[int, Rule("0 to 512", lambda v: 0 <= v <= 512)] = 8
    """Tokens to generate left to right with an LM head."""
    top_k: Annotated[int, AT_LEAST_1] = 5
    """Predictions shown at each [MASK]."""
    threads: Annotated[int, THREADS] = 1
    """CPU threads: one sentence is little work, and one thread is fastest on a busy machine (0: torch's
    count)."""


@dataclass
class Loaded:
    model: nn.Module            # the checkpoint's model (encoder, or encoder + head), fp32, eval mode
    tokenizer: Tokenizer
    path: Path

    @property
    def encoder(self) -> BertModel:
        return self.model if isinstance(self.model, BertModel) else self.model.bert

    @property
    def causal(self) -> bool:
        return bool(self.model.config.causal)

    @property
    def mlm(self) -> nn.Module | None:
        """The (masked or, for a causal checkpoint, next-token) LM head, if the checkpoint has one."""
        return getattr(self.model, "mlm", None)


def load(path: str | Path) -> Loaded:
    """A checkpoint folder as inspection runs it: plain fp32 modules on the CPU (a pre-training
    checkpoint folder, checkpoints/step-N, is read from its model/)."""
    if not Path(path).is_dir():
        raise InspectError(f"--model {path}: no such folder")
    path = model_folder(path)
    if not (path / "config.json").is_file():
        raise InspectError(f"--model {path}: no config.json (not a model folder)")
    return Loaded(load_model(path, random_init=False).float().eval(), Tokenizer.from_dir(path), path)


# ---- attention, written out --------------------------------------------------------------------
def explicit_attention(m: SelfAttention, x: Tensor, layout: Tensor | None) -> tuple[Tensor, Tensor]:
    """SelfAttention `m` on a padded (B, T, C) batch by the formula: softmax(Q K^T / sqrt(D) + bias)
    V, then the output projection. Returns (output (B, T, C), probabilities (B, H, T, T))."""
    if layout is not None and not isinstance(layout, Tensor):
        raise ValueError("explicit attention runs on padded batches (a (B, T) mask or None), not packed ones")
    B, T, _ = x.shape
    split = lambda t: t.unflatten(-1, (m.num_heads, -1)).transpose(1, 2)        # (B, T, C) -> (B, H, T, D)
    q, k, v = split(m.query(x)), split(m.key(x)), split(m.value(x))
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])                  # (B, H, T, T)
    if m.slopes is not None:
        scores = scores + alibi_bias(m.slopes, T, q)[None]
    allowed = torch.ones(T, T, dtype=torch.bool, device=x.device)
    if m.causal:
        allowed = allowed.tril()
    if layout is not None:
        allowed = allowed & layout.bool()[:, None, None, :]                      # (B, 1, T, T)
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)              # (B, H, T, T)
    y = (probs @ v).transpose(1, 2).flatten(-2)                                  # (B, T, C)
    return m.out(y), probs


@contextlib.contextmanager
def direction(encoder: BertModel, causal: bool | None) -> Iterator[None]:
    """Every attention layer of `encoder` runs with a causal mask (True), bidirectionally (False) or
    as the checkpoint says (None), inside the block."""
    layers = [m for m in encoder.modules() if isinstance(m, SelfAttention)]
    before = [m.causal for m in layers]
    try:
        for m in layers:
            m.causal = m.causal if causal is None else causal
        yield
    finally:
        for m, c in zip(layers, before):
            m.causal = c


@contextlib.contextmanager
def recording(encoder: BertModel) -> Iterator[list[Tensor]]:
    """Inside the block every attention layer runs `explicit_attention` and appends its (B, H, T, T)
    probabilities to the yielded list, in layer order; the rest of each block is the model's own code."""
    layers = [m for m in encoder.modules() if isinstance(m, SelfAttention)]
    if len(layers) != len(encoder.blocks):
        raise InspectError("this model's attention layers are not model.py's SelfAttention (prepacked or "
                           "exported?): inspect loads the checkpoint folder itself")
    probs: list[Tensor] = []

    def explicit(m: SelfAttention, x: Tensor, layout) -> Tensor:
        y, p = explicit_attention(m, x, layout)
        probs.append(p)
        return y

    try:
        for m in layers:
            m.forward = explicit.__get__(m)                  # an instance attribute: nn.Module calls it
        yield probs
    finally:
        for m in layers:
            m.__dict__.pop("forward", None)


@dataclass
class Trace:
    states: Tensor          # (L+1, T, C): the embedding output and every block's output
    probs: Tensor           # (L, H, T, T): attention probabilities, rows sum to 1
    max_diff: float         # max |state| difference of the explicit-attention run against the model's own run
    row_error: float        # max |1 - row sum| of the probabilities


@torch.no_grad()
def trace(encoder: BertModel, ids: list[int], types: list[int]) -> Trace:
    """One sequence through the encoder twice: the model's own path (SDPA) and with the attention
    written out, recording its probabilities."""
    reference = states(encoder, ids, types)                                     # (L+1, T, C)
    with recording(encoder) as probs:
        recorded = states(encoder, ids, types)
    p = torch.cat(probs)                                                        # (L, H, T, T)
    return Trace(recorded, p, float((recorded - reference).abs().max()), float((p.sum(-1) - 1).abs().max()))


@torch.no_grad()
def states(encoder: BertModel, ids: list[int], types: list[int], causal: bool | None = None) -> Tensor:
    """(L+1, T, C) every layer's states of one sequence, the model's own path."""
    with direction(encoder, causal):
        return torch.stack(encoder(torch.tensor([ids]), torch.tensor([types]), all_layers=True))[:, 0]


# ---- the input --------------------------------------------------------------------------------
def encode(loaded: Loaded, text: str, pair: str | None = None):
    """[CLS] text [SEP] (pair [SEP]), whole: a text longer than the model's positions is an error, not cut."""
    if not text or not text.strip():
        raise InspectError("the text is empty")
    if pair is not None and not pair.strip():
        raise InspectError("the pair is empty (leave it out to inspect one sentence)")
    enc = loaded.tokenizer.encode(text, pair)
    limit = loaded.model.config.max_position_embeddings
    if len(enc) > limit:
        raise InspectError(f"the input is {len(enc)} tokens ([CLS] and [SEP] included); this model reads at most "
                           f"{limit} positions: shorten the text")
    return enc


def split_words(text: str) -> tuple[str, str]:
    """One text as a pair for the segment-change test: its first half of words | the rest."""
    words = text.split()
    if len(words) < 2:
        raise InspectError("the segment-change test needs a right-hand segment: give a pair, or a text of at "
                           "least two words (split in half)")
    half = len(words) // 2
    return " ".join(words[:half]), " ".join(words[half:])


# ---- where the summary position looks ----------------------------------------------------------
def summary_attention(probs: Tensor, ids: list[int], sep_id: int, causal: bool) -> dict:
    """The summary position's attention row per layer and head: [CLS]'s (row 0), or under a causal
    mask the last token's (where [CLS] can only see itself). Mass on [CLS] / [SEP] / words per layer,
    averaged over heads."""
    row = probs.shape[-1] - 1 if causal else 0
    r = probs[:, :, row, :]                                                    # (L, H, T)
    sep = torch.tensor([i == sep_id for i in ids])
    first = torch.arange(len(ids)) == 0
    mean = r.mean(1)                                                           # (L, T)
    mass = {name: mean[:, m].sum(-1).tolist() for name, m in
            (("[CLS]", first), ("[SEP]", sep), ("words", ~(first | sep)))}
    per_head = {name: r[:, :, m].sum(-1).tolist() for name, m in (("[CLS]", first), ("[SEP]", sep))}
    return {"position": row, "rows": r.tolist(), "mean": mean.tolist(), "mass": mass, "mass_per_head": per_head}


# ---- the segment-change test -------------------------------------------------------------------
def relative_change(a: Tensor, b: Tensor, n: int) -> Tensor:
    """(L+1, n): ||a_i - b_i|| / ||a_i|| for the first n positions of every layer."""
    return (a[:, :n] - b[:, :n]).norm(dim=-1) / a[:, :n].norm(dim=-1).clamp(min=1e-12)


def replacements(loaded: Loaded, enc, text: str, other: str | None, seed: int = 0) -> dict[str, list[int]]:
    """The right-hand segment's ids replaced: by as many [MASK]s, by its pieces shuffled (when that
    changes anything) and by the pieces of `other` (another sentence)."""
    tok = loaded.tokenizer
    n_left = enc.sequence_ids.index(1)
    left, right = enc.input_ids[:n_left], enc.input_ids[n_left:-1]
    out = {"masks": left + [tok.mask_id] * len(right) + [tok.sep_id]}
    order = torch.randperm(len(right), generator=torch.Generator().manual_seed(seed)).tolist()
    shuffled = [right[i] for i in order]
    if shuffled == right:
        shuffled = right[1:] + right[:1]
    if shuffled != right:
        out["shuffled"] = left + shuffled + [tok.sep_id]
    if other is not None:
        replaced = encode(loaded, text, other).input_ids
        if replaced != enc.input_ids:
            out["other sentence"] = replaced
    return out


def segment_test(loaded: Loaded, text: str, pair: str, other: str | None = None) -> dict:
    """Per attention direction (the checkpoint's; for a bidirectional one a causal run too) and per
    replacement of the right segment: the left tokens' relative state change per layer (L+1, n_left)."""
    enc = encode(loaded, text, pair)
    n_left = enc.sequence_ids.index(1)
    variants = replacements(loaded, enc, text, other)
    modes = ("causal",) if loaded.causal else ("bidirectional", "causal")
    change: dict[str, dict[str, list]] = {}
    summary = {}
    for mode in modes:
        causal = mode == "causal"
        base = states(loaded.encoder, enc.input_ids, enc.token_type_ids, causal)
        change[mode] = {}
        for name, ids in variants.items():
            types = [0] * n_left + [1] * (len(ids) - n_left)
            change[mode][name] = relative_change(base, states(loaded.encoder, ids, types, causal), n_left).tolist()
        t = torch.tensor(list(change[mode].values()))                         # (R, L+1, n_left)
        summary[mode] = {"last_layer_mean": float(t[:, -1].mean()), "last_layer_cls": float(t[:, -1, 0].mean()),
                         "max": float(t.max()), "per_layer_mean": t.mean((0, 2)).tolist()}
    return {"text": text, "pair": pair, "left_tokens": enc.tokens[:n_left], "right_tokens": enc.tokens[n_left:],
            "replacements": {k: loaded.tokenizer.convert_ids_to_tokens(v[n_left:]) for k, v in variants.items()},
            "change": change, "summary": summary}


# ---- the LM head: fill the masks, and try to generate -------------------------------------------
@torch.no_grad()
def fill_masks(loaded: Loaded, enc, top_k: int = 5) -> list[dict]:
    """The top_k tokens and probabilities at each [MASK] of the input."""
    tok = loaded.tokenizer
    at = [i for i, t in enumerate(enc.input_ids) if t == tok.mask_id]
    if not at or loaded.mlm is None or loaded.causal:
        return []
    h = states(loaded.encoder, enc.input_ids, enc.token_type_ids)[-1]
    p = loaded.mlm(h[at]).float().softmax(-1)                                 # (M, V)
    top = p.topk(min(top_k, p.shape[-1]), -1)
    return [{"position": i, "candidates": [{"token": tok.convert_ids_to_tokens([t])[0], "prob": float(v)}
                                           for v, t in zip(top.values[k].tolist(), top.indices[k].tolist())]}
            for k, i in enumerate(at)]


@torch.no_grad()
def generate(loaded: Loaded, prompt: str, steps: int = 8) -> dict:
    """Greedy left-to-right generation. An MLM: [CLS] prompt [MASK] [SEP], the argmax replaces the
    [MASK], a new [MASK] goes after it; repeat. A causal checkpoint: its head at the last position
    predicts the next token. Stops early at the model's positions."""
    tok, enc = loaded.tokenizer, encode(loaded, prompt)
    limit = loaded.model.config.max_position_embeddings
    ids, picked, probs = enc.input_ids[:-1], [], []                           # [CLS] prompt
    for _ in range(steps):
        if len(ids) + 2 > limit:
            break
        row = ids if loaded.causal else ids + [tok.mask_id, tok.sep_id]
        h = states(loaded.encoder, row, [0] * len(row))[-1]
        at = len(ids) - 1 if loaded.causal else len(ids)
        p = loaded.mlm(h[at]).float().softmax(-1)
        best = int(p.argmax())
        ids.append(best)
        picked.append(tok.convert_ids_to_tokens([best])[0])
        probs.append(float(p[best]))
    return {"method": "next token at the last position" if loaded.causal else "append [MASK], take the argmax, repeat",
            "prompt": prompt, "tokens": picked, "probs": probs,
            "text": tok.decode(ids[len(enc.input_ids) - 1:], skip_special_tokens=False)}


# ---- everything, and what it answers -----------------------------------------------------------
def inspect(loaded: Loaded, text: str, pair: str | None = None, options: InspectOptions | None = None,
            **changes) -> dict:
    """All measurements on one input, as plain JSON-able values (see the module docstring), as
    `options` say (`InspectOptions`; keyword arguments of its fields change single ones)."""
    o = dataclasses.replace(options or InspectOptions(), **changes)
    cfg = loaded.model.config
    layer = cfg.num_layers if o.layer is None else o.layer
    if not 1 <= layer <= cfg.num_layers:
        raise InspectError(f"--layer {layer}: this model has layers 1 to {cfg.num_layers}")
    if o.replace is not None and not o.replace.strip():
        raise InspectError("--replace is empty: give another sentence")
    enc = encode(loaded, text, pair)
    t = trace(loaded.encoder, enc.input_ids, enc.token_type_ids)
    left, right = (text, pair) if pair is not None else split_words(text)
    name = "/".join(loaded.path.parts[-2:]) if loaded.path.name in ("model", "final") else loaded.path.name
    out = {"model": {"path": str(loaded.path), "name": name, "architecture": type(loaded.model).__name__,
                     "layers": cfg.num_layers, "heads": cfg.num_heads, "hidden": cfg.hidden_size,
                     "causal": loaded.causal, "lm_head": loaded.mlm is not None,
                     "positions": cfg.max_position_embeddings},
           "text": text, "pair": pair, "tokens": enc.tokens,
           "check": {"max_diff": t.max_diff, "row_error": t.row_error},
           "attention": summary_attention(t.probs, enc.input_ids, loaded.tokenizer.sep_id, loaded.causal),
           "layer": layer, "layer_maps": t.probs[layer - 1].tolist(),
           "segment": {**segment_test(loaded, left, right, o.replace), "split": pair is None}}
    if loaded.mlm is not None:
        out["fill_mask"] = fill_masks(loaded, enc, o.top_k)
        prompt = text.split("[MASK]")[0].strip() or text
        out["generate"] = generate(loaded, prompt, o.steps) if o.steps else None
    out["answers"] = answers(out)
    return out


def answers(r: dict) -> dict[str, str]:
    """The overview's two checkpoint questions, answered from what was measured on this input."""
    m, mass, seg = r["model"], r["attention"]["mass"], r["segment"]["summary"]
    L = m["layers"]
    pct = lambda x: f"{100 * x:.0f}%"
    parked = [str(i + 1) for i in range(L) if mass["words"][i] < 0.5]
    sinks = (f" In layer{'s' * (len(parked) > 1)} {', '.join(parked)} more than half of it rests on [CLS] itself or "
             f"[SEP]: heads with nothing to gather park on a special token and change little." if parked else "")
    moved = seg.get("bidirectional", {}).get("last_layer_cls", 0.0)
    causal = seg["causal"]
    if m["causal"]:
        cls = (f"Under this checkpoint's causal mask [CLS] sees only itself (100% of its attention in every layer), "
               f"so the summary is the last token's state: in layer 1 it puts {pct(mass['words'][0])} of its attention "
               f"on the words, in layer {L} {pct(mass['words'][-1])}.")
        mask = (f"This checkpoint is causal: replacing the right segment left the left tokens unchanged to rounding "
                f"(max relative change {tiny(causal['max'])} over all layers) - a left-to-right model.")
    else:
        cls = (f"[CLS] carries no word; its state is what attention gathers into it, and under BERT's mask it reads "
               f"every position in every layer. On this input, layer 1: {pct(mass['words'][0])} of [CLS]'s attention "
               f"(mean over heads) on the words, {pct(mass['[CLS]'][0])} on itself, {pct(mass['[SEP]'][0])} on [SEP]; "
               f"layer {L}: {pct(mass['words'][-1])} / {pct(mass['[CLS]'][-1])} / {pct(mass['[SEP]'][-1])}.{sinks} "
               f"Replacing the right segment moved [CLS]'s last-layer state by {num(moved)} (relative L2): "
               + ("it depends on the whole input, which is why one vector can stand for the sentence (pair) - once a "
                  "head (NSP, a classifier) trains it to; it is not a good sentence embedding by itself." if moved > 0.05
                  else "barely: this model's [CLS] gathers little yet (a head trained on it, NSP or a classifier, is "
                       "what makes it a summary)."))
        bi = seg["bidirectional"]
        mask = (f"The attention mask: under BERT's bidirectional mask every position sees its right. Replacing the "
                f"right segment moved the left tokens' last-layer states by {num(bi['last_layer_mean'])} on "
                f"average (max {num(bi['max'])}, relative L2); run with a causal mask, by at most {tiny(causal['max'])} "
                f"(zero up to rounding). A generator's state at position t must not depend on what comes after t.")
    gen = r.get("generate")
    if not m["lm_head"]:
        objective = (f"The objective: this checkpoint has no language-model head ({m['architecture']}), so "
                     "generation cannot be tried on it; MLM trains p(x_i | both sides) at masked positions only, "
                     "never p(next | left).")
    elif m["causal"]:
        objective = (f"The objective: trained on the next token (train.objective=clm), it generates (as well as its "
                     f"training allows): '{gen['prompt']}' -> '{gen['text']}'." if gen
                     else "The objective: trained on the next token.")
    else:
        said = (f" Appending [MASK] before [SEP] and taking the argmax {len(gen['tokens'])} times gave "
                f"'{gen['prompt']}' -> '{gen['text']}' ({_degenerate(gen['tokens'])}): it fills a slot of a sentence "
                f"that ends right after it ([SEP] is to its right), not a continuation.") if gen else ""
        objective = ("The objective: MLM trains p(x_i | every unmasked token, both sides) at ~15% of positions and "
                     "never p(x_{t+1} | x_1..x_t)." + said +
                     " To make it a generator: a causal mask and the next-token objective (bertkit: "
                     "train.objective=clm, model.causal: true), or a decoder.")
    return {"cls": cls, "generate": mask + " " + objective}


def num(x: float) -> str:
    return f"{x:.2f}" if x >= 0.1 else f"{x:.3f}"


def tiny(x: float) -> str:
    """A difference that should be rounding: 0 when it is exactly 0, else its order of magnitude."""
    return "0" if x == 0 else f"{x:.0e}" if x < 1e-3 else f"{x:.3f}"


def _degenerate(tokens: list[str]) -> str:
    if not tokens:
        return "nothing"
    top = max(set(tokens), key=tokens.count)
    return f"{len(set(tokens))} distinct token(s) in {len(tokens)}; '{top}' {tokens.count(top)} times"
