exec(open(__file__.rsplit("/", 1)[0] + "/spin.py").read().split("pt = bertkit_runner")[0])
import transformers
hf = transformers.AutoModel.from_pretrained(path, attn_implementation="sdpa").eval()
IM = torch.inference_mode(); IM.__enter__()
t16 = {k: torch.tensor(v) for k, v in b16["numpy"].items()}
W = torch.randn(384, 1536); X = torch.randn(64, 384)
pre = {"none": lambda: None, "gemm": lambda: X @ W, "hf": lambda: hf(**t16), "stop": S["stop"], "nostop": S["nostop"],
       "pt-bertkit": lambda: pt(b16)}
pt = bertkit_runner(p)
for f in list(S.values()) + list(pre.values()): f(); f()
cases = [(a, k) for a in pre for k in S]
res = {c: [] for c in cases}
for r in range(int(sys.argv[1])):
    random.shuffle(cases)
    for a, k in cases:
        pre[a](); time.sleep(0.3)
        t0 = time.perf_counter(); S[k](); res[(a, k)].append(time.perf_counter() - t0)
for k in S:
    print("%-7s" % k, "  ".join("%s %.2f/%.2f" % (a, 1e3 * np.median(res[(a, k)]), 1e3 * np.percentile(res[(a, k)], 80)) for a in pre))
