"""The int8 export written by graph.py (DynamicQuantizeMatMul, standard attention, 8-bit weights, the FFN input
smoothed) in variants, against onnxruntime's quantize_dynamic per channel ('old', the export of 6141ce4):
the FFN down projection int8 or fp32, its own input smoothed too (alpha 0.5, 0.7). Parity (export.check_parity)
and run speed by export_int8_speed.py (7 rounds). as run: graph.py of 67d1d51 beside export.py of 6141ce4 (the
state between the two commits). usage (from the repository root):
    python benchmarks/results/zen4-2026-12-07/export_int8_variants.py"""
import sys, tempfile
from pathlib import Path
import torch
torch.set_num_threads(2)
sys.path.insert(0, "benchmarks")
from infer_vs_hf import minilm_dir
sys.path.insert(0, str(Path(__file__).parent))
from export_int8_speed import speed          # the same timing
from bertkit.checkpoint import load_model
from bertkit.tokenizer import Tokenizer
from bertkit.infer import export, graph, choose, engines
d = minilm_dir(); tmp = Path(tempfile.mkdtemp())
model = load_model(d, random_init=False).float().eval()
tok = Tokenizer.from_dir(d)
wrapper = export.Exportable(model).eval()
old = tmp / "old.onnx"; export.export_onnx(d, old, int8=True)   # quantize_dynamic: export.py of 6141ce4
rows = choose.sample_rows(tok, 512)
cal = engines.make_batches(rows, 8, torch.device("cpu"))
ranges = graph.ffn_input_ranges(model, cal)
down_r = [torch.zeros(model.config.intermediate_size) for _ in model.blocks]
def seen(i):
    def hook(m, a): down_r[i] = torch.maximum(down_r[i], a[0].detach().abs().reshape(-1, down_r[i].numel()).amax(0))
    return hook
hs = [b.mlp.down.register_forward_pre_hook(seen(i)) for i, b in enumerate(model.blocks)]
with torch.inference_mode():
    for b in cal:
        t = b.tensors; model(t["input_ids"], t["token_type_ids"], None, t["position_ids"], packed=b.packed)
for h in hs: h.remove()
def make_ffn(smooth_down, alpha=0.5):
    def _ffn(g, x, mlp, act, rng, i):
        w = mlp.up.weight.detach()
        s = (ranges[i].clamp_min(1e-5) / w.abs().amax(0).clamp_min(1e-8)).sqrt()
        x, w = g.op("Mul", x, g.const(1 / s)), w * s
        up = graph._activation(g, g.linear(x, w, mlp.up.bias), act)
        wd = mlp.down.weight.detach()
        if smooth_down:
            sd = (down_r[i].clamp_min(1e-5) ** alpha / wd.abs().amax(0).clamp_min(1e-8) ** (1 - alpha))
            up, wd = g.op("Mul", up, g.const(1 / sd)), wd * sd
        return g.linear(up, wd, mlp.down.bias, int8=True)
    return _ffn
orig = graph._ffn
files = {"old": old}
for name, ffn in (("down int8", make_ffn(False)), ("down int8 smoothed", make_ffn(True)), ("down int8 smoothed a.7", make_ffn(True, 0.7))):
    graph._ffn = ffn
    f = tmp / f"{len(files)}.onnx"
    f.write_bytes(graph.encoder_graph(model, True, fused=True, levels=127, ranges=ranges, fused_inputs=False))
    graph._ffn = orig
    files[name] = export._optimize(f, tmp / f"o{len(files)}.onnx")
f = tmp / "base.onnx"; f.write_bytes(graph.encoder_graph(model, True, fused=True, levels=127, ranges=ranges, fused_inputs=False))
files["down fp32 (new)"] = export._optimize(f, tmp / "obase.onnx")
for k, f in files.items():
    print(k, export.check_parity(wrapper, f, tok).line(), flush=True)
speed(files, rounds=7)
