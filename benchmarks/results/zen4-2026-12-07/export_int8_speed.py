"""Run speed of exported ONNX files on onnxruntime (2 threads): 1 x 16 (mean of 10 calls), 32 ragged texts of
8-128 tokens and 32 x 128 (one call each), after a 0.2 s pause; medians of 9 rounds, order random.
usage (from the repository root): python benchmarks/results/zen4-2026-12-07/export_int8_speed.py NAME=FILE ..."""
import sys, time, statistics, random
import numpy as np
sys.path.insert(0, "benchmarks")
from infer_vs_hf import minilm_dir, make_inputs
from bertkit.tokenizer import Tokenizer
from bertkit.infer import engines


def speed(files: dict, rounds: int = 9) -> None:
    """Print each file's medians (NAME: path), timed as the module doc says."""
    tok = Tokenizer.from_dir(minilm_dir())
    sess = {k: engines.load_session(f, threads=2) for k, f in files.items()}
    lengths = np.random.default_rng(0).permutation(np.linspace(8, 128, 32).round().astype(int)).tolist()
    feeds = {n: {k: x["numpy"][k] for k in ("input_ids", "attention_mask", "token_type_ids")}
             for n, x in (("1x16", make_inputs(tok, [16])), ("ragged", make_inputs(tok, lengths)),
                          ("fixed", make_inputs(tok, [128] * 32)))}
    times = {(k, n): [] for k in sess for n in feeds}
    for r in range(rounds):
        order = list(times); random.Random(r).shuffle(order)
        for k, n in order:
            time.sleep(0.2); reps = 10 if n == "1x16" else 1
            t = time.perf_counter()
            for _ in range(reps):
                sess[k].run(None, feeds[n])
            times[(k, n)].append((time.perf_counter() - t) / reps * 1e3)
    width = max(map(len, sess))
    for k in sess:
        print(f"{k:{width}s} " + "  ".join(f"{n} {statistics.median(times[(k, n)]):.2f} ms" for n in feeds))


if __name__ == "__main__":
    speed(dict(a.split("=") for a in sys.argv[1:]))
