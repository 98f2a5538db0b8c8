exec(open(__file__.rsplit("/", 1)[0] + "/ab.py").read().split("fs = {")[0])
import cProfile, pstats
IM = torch.inference_mode(); IM.__enter__()
run = bertkit_runner(p)
real = p.small.runner
out = real.run(ids, mask, types)
class Dummy:
    precision = "float32"; threads = 2
    def run(self, i, m, t): return out
def t(f, n=2000):
    f(); t0 = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - t0) / n * 1e6
p.small.runner = Dummy()
print("path with a runner that returns at once: %.1f us" % t(lambda: run(b)))
print("  batches only: %.1f us" % t(lambda: p.batches(b["rows"])))
bb = p.batches(b["rows"])[0]
print("  hidden only: %.1f us" % t(lambda: p.hidden(bb, torch.float32)))
cProfile.run("for _ in range(2000): run(b)", "/tmp/fc/prof")
pstats.Stats("/tmp/fc/prof").sort_stats("tottime").print_stats(12)
