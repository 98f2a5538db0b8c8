"""Inference: a checkpoint loaded once and run on batches (`Predictor`).

    predictor.py   the Predictor: load, batch by length (padding-free), embed / classify / fill_mask / ner / qa
    options.py     PredictorOptions: how it runs (device, threads, precision, int8, backend, ...), the commands' flags
    engines.py     what runs a batch, one interface: PyTorch, an exported file on onnxruntime, the encoder's
                   graph on onnxruntime or OpenVINO
    choose.py      what runs, decided at load and checked against fp32: precision, int8, the engine of short batches
    graph.py       the encoder written out as an ONNX graph from its weights
    prepack.py     the encoder's Linear weights prepacked for oneDNN (CPU)
    export.py      `bertkit export onnx` (ExportOptions: its flags), parity-checked
"""
from .choose import agreement
from .engines import Batch, length_buckets
from .options import PredictorError, PredictorOptions
from .predictor import Predictor

__all__ = ["Batch", "Predictor", "PredictorError", "PredictorOptions", "agreement", "length_buckets"]
