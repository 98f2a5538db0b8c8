"""One int8 Linear at the int8 Predictor's shapes (all-MiniLM-L6-v2: 384 -> 1152 QKV, 384 -> 384 out,
384 -> 1536 up; 2176 rows, the ragged batch's tokens, and 4096, the full one): bertkit's Int8Linear
(fbgemm's dynamic int8 GEMM, rows scaled to one range first) against onnxruntime's DynamicQuantizeMatMul
(MLAS) in a one-node session on the same rows (also scaled), and the fp32 GEMM (torch.nn.functional.linear),
2 threads, 15 interleaved rounds; also the same with a torch op (GELU on the output) between calls,
as in the model, where both runtimes' worker threads hand the cores to each other."""
import time, random, numpy as np, torch, onnxruntime as ort
from onnx import helper, numpy_helper, TensorProto
from bertkit.infer.choose import Int8Linear
torch.set_num_threads(2)
IM = torch.inference_mode(); IM.__enter__()
def session(w: torch.Tensor, b: torch.Tensor, levels=63):
    wt = w.t().contiguous()
    scale = wt.abs().amax(0).clamp_min(1e-12) / levels
    q = torch.round(wt / scale).clamp(-levels, levels).to(torch.int8).numpy()
    inits = [numpy_helper.from_array(q, "W"), numpy_helper.from_array(scale.numpy().astype(np.float32), "S"),
             numpy_helper.from_array(b.numpy().astype(np.float32), "B")]
    node = helper.make_node("DynamicQuantizeMatMul", ["x", "W", "S", "", "B"], ["y"], domain="com.microsoft")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", w.shape[1]])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", w.shape[0]])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)])
    so = ort.SessionOptions(); so.intra_op_num_threads, so.inter_op_num_threads = 2, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    so.add_session_config_entry("session.force_spinning_stop", "1")
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
for out, inp in ((1152, 384), (384, 384), (1536, 384)):
    lin = torch.nn.Linear(inp, out); lin.weight.data.normal_(0, 0.05)
    fb, s = Int8Linear(lin, 63), session(lin.weight.detach(), lin.bias.detach())
    for n in (2176, 4096):
        x = torch.randn(n, inp)
        def ort_run(x=x):
            r = x.abs().amax(-1, keepdim=True).clamp_min_(1e-12)
            y = torch.from_numpy(s.run(None, {"x": (x / r).numpy()})[0])
            return y.mul_(r)
        fs = {"fp32": lambda: torch.nn.functional.linear(x, lin.weight, lin.bias), "fbgemm int8": lambda: fb(x),
              "mlas int8": ort_run,
              "fbgemm int8 + gelu": lambda: torch.nn.functional.gelu(fb(x)), "mlas int8 + gelu": lambda: torch.nn.functional.gelu(ort_run())}
        ts = {k: [] for k in fs}; names = list(fs)
        for r in range(15):
            random.shuffle(names)
            for k in names:
                fs[k](); t = time.perf_counter()
                for _ in range(5): fs[k]()
                ts[k].append((time.perf_counter() - t) / 5)
        med = {k: np.median(v) * 1e3 for k, v in ts.items()}
        print(f"{n} x {inp} -> {out}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in med.items())
              + f"; mlas/fbgemm {med['fbgemm int8'] / med['mlas int8']:.2f}x, with gelu {med['fbgemm int8 + gelu'] / med['mlas int8 + gelu']:.2f}x")
