"""`bertkit export onnx`: a thin layer over bertkit.infer.export (its options: ExportOptions' fields)."""
from __future__ import annotations

import argparse

from ..cliconfig import add_gone, add_options
from ..errors import BertkitError
from ..infer.export import ExportOptions, export_onnx
from .basic import Args, options_of


def setup_export(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="format", metavar="FORMAT", required=True)
    o = sub.add_parser("onnx", help="ONNX with dynamic batch and sequence axes, checked against PyTorch",
                       description="Export a checkpoint to ONNX (opset 20, written from its weights), then check "
                                   "it on onnxruntime against PyTorch on several batch sizes, lengths and paddings.")
    add_options(o, Args, names=("model", "out", "head"), defaults=True, required=("out",), help={
        "out": "output FILE.onnx (DIR/model.onnx is what --backend onnx looks for by default)"})
    add_options(o, ExportOptions)
    add_gone(o, {"--opset": "the file is always ONNX opset 20 (bertkit writes the graph itself)"})
    p.set_defaults(run=run_export)


def run_export(args) -> int:
    try:
        import onnx, onnxruntime  # noqa: F401,E401 - int8's and the parity check's, imported late
    except ImportError as e:
        raise BertkitError(f"ONNX export needs onnx and onnxruntime: pip install 'bertkit[onnx]' ({e})") from None
    report = export_onnx(args.model, args.out, options_of(args, ExportOptions), head=args.head)
    print(f"wrote {args.out}")
    print(report.line())
    return 0
