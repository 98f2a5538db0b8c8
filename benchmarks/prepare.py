"""bertkit prepare vs google-research/bert's create_pretraining_data.py, on the shared corpus.

    nice -n 10 python benchmarks/prepare.py [--data ../shared/data/pretrain] [--json out.json]

Every run is its own process (as a user would run it), timed from start to exit, with the peak
resident memory of its whole process tree (sampled from /proc every 50 ms; shared pages of
workers count once per process, so this over-states ours). The reference is `google_reference.py`:
Google's tokenizer and builder in pure Python, single process, with its in-memory design (all
documents, then all instances, then it writes them), run on the same files with the same
settings: length 128, NSP, static masking, dupe factor 1. bertkit runs the same job (--masking static --dupe-factor 1) on
the corpus (1x) and on ten copies of it (10x), with 1 and 2 workers. Also printed: CPU seconds,
which are less sensitive than wall time to other jobs on a shared machine. Ratios come last.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"


def tree_rss_kb(root: int) -> int:
    """Resident memory (kB) of `root` and all its descendants, from /proc."""
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    tree, frontier = {root}, [root]
    while frontier:
        p = frontier.pop()
        for c, pp in parent.items():
            if pp == p and c not in tree:
                tree.add(c)
                frontier.append(c)
    total = 0
    for p in tree:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def measure(cmd: list[str]) -> dict:
    """Run a command; wall seconds, CPU seconds and peak tree RSS (MB)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0]

    def sample():
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_rss_kb(proc.pid))
            time.sleep(0.05)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    th.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{err[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": peak[0] / 1024, "stdout": out, "stderr": err}


def raw_bytes(files: list[Path]) -> int:
    import gzip
    n = 0
    for f in files:
        with (gzip.open(f, "rb") if f.suffix == ".gz" else open(f, "rb")) as fh:
            while chunk := fh.read(1 << 20):
                n += len(chunk)
    return n


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*.npy")):
        h.update(str(p.relative_to(folder)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


GOOGLE = """
import sys, json, time
sys.path.insert(0, {bench!r})
import google_reference as g
files = json.loads(sys.argv[1])
t = time.perf_counter()
inst = g.run(files, {vocab!r}, sys.argv[2], max_seq_length=128, dupe_factor=1, seed=12345)
n = len(inst)
print(json.dumps({{"instances": n, "random_next": sum(i.is_random_next for i in inst) / n, "seconds": time.perf_counter() - t}}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA / "pretrain"), help="folder of corpus files (.txt, .txt.gz)")
    ap.add_argument("--vocab", default=str(DATA / "vocab" / "bert-base-uncased-vocab.txt"))
    ap.add_argument("--copies", type=int, default=10)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--skip-google", action="store_true")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    files = sorted(Path(args.data).glob("*.txt*"))
    if not files:
        raise SystemExit(f"{args.data}: no corpus files")
    tmp = Path(tempfile.mkdtemp(prefix="bench_prepare_"))
    results: dict = {"corpus_files": [str(f) for f in files]}
    try:
        tokdir = tmp / "tok"
        tokdir.mkdir()
        shutil.copy(args.vocab, tokdir / "vocab.txt")
        big = tmp / "big"
        big.mkdir()
        for c in range(args.copies):
            for f in files:
                shutil.copy(f, big / f"{c:02d}_{f.name}")
        sizes = {"1x": raw_bytes(files), f"{args.copies}x": raw_bytes(files) * args.copies}
        inputs = {"1x": [str(f) for f in files], f"{args.copies}x": [str(big)]}
        rows = []
        if not args.skip_google:
            code = GOOGLE.format(bench=str(REPO / "benchmarks"), vocab=args.vocab)
            r = measure([sys.executable, "-c", code, json.dumps([str(f) for f in files]), str(tmp / "google.bin")])
            info = json.loads(r["stdout"].strip().splitlines()[-1])
            rows.append(("google (pure Python)", "1x", 1, r, sizes["1x"], info["random_next"]))
        digests = {}
        for scale in ("1x", f"{args.copies}x"):
            for workers in args.workers:
                out = tmp / f"out_{scale}_{workers}"
                cmd = [sys.executable, "-m", "bertkit", "prepare", "--model", str(tokdir), "--input", *inputs[scale],
                       "--out", str(out), "--masking", "static", "--dupe-factor", "1", "--workers", str(workers),
                       "--no-progress"]
                r = measure(cmd)
                meta = json.loads((out / "meta.json").read_text())
                digests[(scale, workers)] = digest(out)
                rows.append(("bertkit prepare", scale, workers, r, sizes[scale],
                             meta["counts"]["random_next_fraction"]))
                shutil.rmtree(out)
        print(f"{'implementation':22s} {'corpus':>6s} {'workers':>7s} {'MB':>7s} {'wall s':>8s} {'MB/s':>7s} "
              f"{'CPU s':>7s} {'MB/CPU-s':>8s} {'peak RSS MB':>11s} {'random-next':>11s}")
        table = []
        for name, scale, w, r, size, rn in rows:
            mb = size / 1e6
            row = {"implementation": name, "corpus": scale, "workers": w, "mb": mb, "wall_s": r["wall_s"],
                   "mb_per_s": mb / r["wall_s"], "cpu_s": r["cpu_s"], "mb_per_cpu_s": mb / r["cpu_s"],
                   "peak_rss_mb": r["peak_rss_mb"], "random_next_fraction": rn}
            table.append(row)
            print(f"{name:22s} {scale:>6s} {w:7d} {mb:7.1f} {r['wall_s']:8.1f} {mb / r['wall_s']:7.2f} "
                  f"{r['cpu_s']:7.1f} {mb / r['cpu_s']:8.2f} {r['peak_rss_mb']:11.0f} {rn:11.3f}")
        results["runs"] = table
        identical = len(set(digests.values())) == 2          # one digest per corpus, whatever the workers
        results["identical_for_any_workers"] = identical
        print(f"\nshards identical with {', '.join(map(str, args.workers))} workers: {identical}")
        ours = {(r["corpus"], r["workers"]): r for r in table if r["implementation"] == "bertkit prepare"}
        big_key = f"{args.copies}x"
        ratios = {}
        if not args.skip_google:
            g = table[0]
            for w in args.workers:
                ratios[f"speed_vs_google_{w}w_wall"] = ours[("1x", w)]["mb_per_s"] / g["mb_per_s"]
                ratios[f"speed_vs_google_{w}w_cpu"] = ours[("1x", w)]["mb_per_cpu_s"] / g["mb_per_cpu_s"]
            ratios["memory_google_over_ours_1w"] = g["peak_rss_mb"] / ours[("1x", 1)]["peak_rss_mb"]
        for w in args.workers:
            ratios[f"rss_{big_key}_over_1x_{w}w"] = ours[(big_key, w)]["peak_rss_mb"] / ours[("1x", w)]["peak_rss_mb"]
        for w in args.workers[1:]:
            ratios[f"speed_{w}w_over_{args.workers[0]}w_{big_key}"] = \
                ours[(big_key, w)]["mb_per_s"] / ours[(big_key, args.workers[0])]["mb_per_s"]
        results["ratios"] = ratios
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
        print("\nratios:")
        for k, v in ratios.items():
            print(f"  {k:32s} {v:6.2f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
