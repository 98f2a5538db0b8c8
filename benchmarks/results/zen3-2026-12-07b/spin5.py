exec(open(__file__.rsplit("/", 1)[0] + "/spin4.py").read().split("for s in S:")[0])
import transformers
hf = transformers.AutoModel.from_pretrained(path, attn_implementation="sdpa").eval()
pt = bertkit_runner(p)
IM = torch.inference_mode(); IM.__enter__()
t16 = {k: torch.tensor(v) for k, v in b16["numpy"].items()}
pre = {"none": lambda: None, "hf": lambda: hf(**t16), "self": None}
for f in S.values(): f(); f()
pt(mid); hf(**t16)
cases = [(a, k, w) for k in S for a in pre for w in ("first",)] + [("self", k, w) for k in S for w in ("row", "mid-after")] + [("none", "-", "mid-alone")]
res = {c: [] for c in cases}
for r in range(int(sys.argv[1])):
    random.shuffle(cases)
    for a, k, w in cases:
        if w == "mid-alone":
            time.sleep(0.3); t0 = time.perf_counter(); pt(mid); res[(a, k, w)].append(time.perf_counter() - t0); continue
        (pre[a] or S[k])(); time.sleep(0.3)
        if w == "first":
            t0 = time.perf_counter(); S[k](); res[(a, k, w)].append(time.perf_counter() - t0)
        elif w == "row":
            S[k](); t0 = time.perf_counter()
            for _ in range(10): S[k]()
            res[(a, k, w)].append((time.perf_counter() - t0) / 10)
        else:
            S[k](); t0 = time.perf_counter(); pt(mid); res[(a, k, w)].append(time.perf_counter() - t0)
print("mid alone %.2f" % (1e3 * np.median(res[("none", "-", "mid-alone")])))
for k in S:
    print("%-11s" % k, "  ".join("%s %.2f/p80 %.2f" % (f"{w}{'-after-'+a if w == 'first' else ''}", 1e3 * np.median(res[(a, k, w)]), 1e3 * np.percentile(res[(a, k, w)], 80))
                               for (a, kk, w) in sorted(res) if kk == k))
