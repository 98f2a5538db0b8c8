"""Files of `bertkit export onnx` side by side on onnxruntime (2 threads each, no spinning), interleaved:
`python cmp_onnx.py A.onnx B.onnx ...`; medians of 200 calls at 1 x 16 and 7 at 32 x 128."""
import sys, time, numpy as np, onnxruntime as ort
files = sys.argv[1:]
so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.inter_op_num_threads = 1
so.add_session_config_entry("session.intra_op.allow_spinning", "0")   # no session's threads spin into the next one's run
S = [ort.InferenceSession(f, so, providers=["CPUExecutionProvider"]) for f in files]
rng = np.random.default_rng(0)
for B, T in ((1, 16), (32, 128)):
    feed = {"input_ids": rng.integers(1000, 29000, (B, T)).astype(np.int64), "attention_mask": np.ones((B, T), np.int64),
            "token_type_ids": np.zeros((B, T), np.int64)}
    outs = [s.run(None, feed)[0] for s in S]
    print(B, T, "max diff", float(np.abs(outs[0] - outs[1]).max()))
    times = [[] for _ in S]
    for r in range(7 if B > 1 else 200):
        for i, s in enumerate(S):
            t = time.perf_counter(); s.run(None, feed); times[i].append(time.perf_counter() - t)
    print(B, T, [f"{np.median(t)*1e3:.2f} ms" for t in times])
