"""`PredictorOptions`: how a Predictor runs a checkpoint, in one typed dataclass.

    Predictor.from_dir(path, PredictorOptions(precision="fp32", threads=1))
    Predictor.from_dir(path, precision="fp32", threads=1)                  # the same, as keywords

The commands that load a Predictor (`predict`, `evaluate`, `embed`, `fill-mask`, `embed-eval`,
`serve`) take these fields as flags of the same name (`cliconfig.add_options`): --precision,
--small_batches / --no-small_batches, ... There are no environment variables.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from ..errors import BertkitError
from ..runconfig import AT_LEAST_1, THREADS, check_fields


class PredictorError(BertkitError, ValueError):
    """A request the loaded checkpoint cannot answer (wrong head, no [MASK], bad option)."""


@dataclass
class PredictorOptions:
    device: str | None = None
    """cpu, cuda, cuda:1 ... (default: cuda when available)."""
    threads: Annotated[int | None, THREADS] = None
    """CPU threads for the model (default: torch's choice)."""
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """auto: bf16 on a CPU measured faster in bf16 (once per machine) where the model keeps cosine
    >= 0.999 to fp32 on a fixed sample, else fp32 (two machines of different kinds can give vectors
    ~1e-3 apart); fp32 gives the same numbers on every machine up to fp32 rounding; bf16 / fp16 on
    a GPU run varlen flash attention."""
    int8: bool = False
    """Dynamic int8 quantisation of the encoder's Linear layers (CPU, backend torch; its agreement
    with fp32 on a fixed sample is measured at load)."""
    compile: bool = False
    """torch.compile the encoder (slow start; replaces prepacking)."""
    backend: Literal["torch", "onnx", "openvino"] = "torch"
    """torch; onnx: a file from `bertkit export onnx` on onnxruntime; openvino: the encoder's graph
    on OpenVINO (bf16 where the CPU has it and the sample agrees), embeddings and head in PyTorch."""
    onnx_file: str | None = None
    """The exported file for --backend onnx (default: DIR/model.onnx)."""
    prepack: bool = True
    """On the CPU in fp32 or bf16, prepack the encoder's Linear weights for oneDNN."""
    small_batches: bool = True
    """On the CPU, run batches of few tokens on onnxruntime or OpenVINO where one follows the fp32
    model and times faster than PyTorch at load (1-3 s more at load, a second copy of the weights)."""
    small_batch_tokens: Annotated[int | None, AT_LEAST_1] = None
    """Send every batch of at most this many padded tokens (B x T) to the first installed engine
    that agrees with fp32, untimed (default: the engine and the size timed at load)."""
    max_length: Annotated[int | None, AT_LEAST_1] = None
    """Most tokens of one input (default: the checkpoint's limit)."""

    def __post_init__(self):
        check_fields(self, error=PredictorError)    # the choices and ranges on the fields
        if self.backend != "torch" and (self.int8 or self.compile):
            raise PredictorError(f"int8 and compile apply to backend torch, not {self.backend}")
        if self.int8 and self.precision not in ("auto", "fp32"):
            raise PredictorError("precision and int8 are exclusive")

