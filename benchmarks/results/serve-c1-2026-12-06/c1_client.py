import http.client, json, sys, time, subprocess, signal, socket, os, random, statistics, urllib.request
sys.path.insert(0, "/work/main/benchmarks")
from serve_load import texts_pool
from infer_vs_hf import minilm_dir
M = str(minilm_dir())
def port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]
def start(kind, prof=None):
    p = port()
    if kind == "bertkit":
        cmd = [sys.executable] + (["-m", "cProfile", "-o", prof] if prof else []) + ["-m", "bertkit", "serve", "--model", M, "--port", str(p), "--log-level", "warning"]
    elif kind == "inline":
        cmd = [sys.executable, "/tmp/prof/serve_inline.py", "serve", "--model", M, "--port", str(p), "--log-level", "warning"]
    else:
        cmd = [sys.executable, "/work/main/benchmarks/serve_apps.py", "--runtime", kind, "--model", M, "--port", str(p)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    for _ in range(400):
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{p}/readyz", timeout=2).status == 200: return proc, p
        except OSError: time.sleep(0.5)
    raise SystemExit("not ready")
pool = texts_pool()
def drive(p, n):
    c = http.client.HTTPConnection("127.0.0.1", p)
    rng = random.Random(1); lat = []
    for i in range(n):
        body = json.dumps({"texts": rng.sample(pool, 2), "normalize": True})
        t0 = time.perf_counter()
        c.request("POST", "/v1/embed", body, {"content-type": "application/json"})
        r = c.getresponse(); r.read()
        lat.append(time.perf_counter() - t0)
    return statistics.median(lat) * 1e3, statistics.mean(lat) * 1e3
kinds = sys.argv[1].split(",")
prof = sys.argv[2] if len(sys.argv) > 2 else None
servers = {k: start(k, prof if k == "bertkit" else None) for k in kinds}
for k, (proc, p) in servers.items(): drive(p, 200)
for rnd in range(3):
    for k, (proc, p) in servers.items():
        med, mean = drive(p, 800)
        print(rnd, k, f"median {med:.3f} ms mean {mean:.3f} ms", flush=True)
for k, (proc, p) in servers.items():
    proc.send_signal(signal.SIGINT); proc.wait(60)
