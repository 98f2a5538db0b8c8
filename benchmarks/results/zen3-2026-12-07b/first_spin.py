"""First 1 x 16 call after 0.3 s idle on bertkit's fused graph, by session spin setting, after nothing or after
a PyTorch batch (4 x 64) before the pause: median / p80 / share of calls over 10 ms, N rounds."""
exec(open(__file__.rsplit("/", 1)[0] + "/spin4.py").read().split("for s in S:")[0])
pt = bertkit_runner(p)
IM = torch.inference_mode(); IM.__enter__()
for f in S.values(): f(); f()
pre = {"none": lambda: None, "torch": lambda: pt(mid)}
cases = [(a, k) for a in pre for k in S]
res = {c: [] for c in cases}
for r in range(int(sys.argv[1])):
    random.shuffle(cases)
    for a, k in cases:
        pre[a](); time.sleep(0.3)
        t0 = time.perf_counter(); S[k](); res[(a, k)].append(time.perf_counter() - t0)
for k in S:
    print("%-11s" % k, "  ".join("after %s %.2f/p80 %.2f/slow %.0f%%" % (a, 1e3 * np.median(res[(a, k)]), 1e3 * np.percentile(res[(a, k)], 80),
                                                                      100 * np.mean(np.array(res[(a, k)]) > 0.010)) for a in pre))
