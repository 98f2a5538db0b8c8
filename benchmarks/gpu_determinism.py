"""Two GPU facts issue 32's grid needs before it trusts a GPU comparison, in about a minute of a GPU:

1. pytorch/pytorch#196678: does cuDNN attention's backward return NaN in dQ at length 64 with a mask on
   this torch and GPU (torch's default kernel), and is `packing.attention` (which leaves cuDNN out while
   training with a mask) finite on the same inputs?
2. Same command, same weights? A BERT-mini pre-training (ALiBi, bf16, batch 64 x 128) run twice with
   `train.deterministic` off and twice with it on: are the final weights bit-identical, and what does
   determinism cost in updates per second?

    python benchmarks/gpu_determinism.py OUT_DIR [--updates 200]
Writes OUT_DIR/gpu_determinism.json and prints it. On a CPU it runs too (part 1 says so; part 2 then
shows the CPU's own determinism at a smaller size)."""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F


def cudnn_nan_check() -> dict:
    """The upstream report's inputs (every score ~ -120: each row's log-sum-exp below ln(FLT_MAX))."""
    if not torch.cuda.is_available():
        return {"skipped": "no GPU"}
    from bertkit.packing import attention

    out = {}
    for L in (64, 128):
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(2, 4, L, 64, device="cuda", generator=g, dtype=torch.bfloat16) * 0.1 for _ in range(3))
        q[..., 0], k[..., 0] = 1.0, -120 * math.sqrt(64)
        mask = torch.ones(L, L, dtype=torch.bool, device="cuda")[None, None]
        grad = torch.randn(2, 4, L, 64, device="cuda", generator=g, dtype=torch.bfloat16)
        for name, fn in (("torch default", lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=mask)),
                         ("bertkit packing.attention", lambda a, b, c: attention(a, b, c, mask))):
            a, b, c = (t.detach().clone().requires_grad_() for t in (q, k, v))
            fn(a, b, c).backward(grad)
            out[f"L={L} {name}: non-finite dQ"] = int((~torch.isfinite(a.grad)).sum())
    return out


def pretrain_twice(out: Path, updates: int) -> dict:
    from bertkit import Tokenizer
    from bertkit.data.prepare import PrepareConfig, prepare

    raw = out / "sample.txt"
    raw.write_bytes(gzip.decompress((resources.files("bertkit") / "sample" / "inaugural.txt.gz").read_bytes()))
    tok = Tokenizer.train([str(raw)], vocab_size=4000)
    prepare([str(raw)], tok, out / "data", PrepareConfig(max_length=128), progress=False)
    gpu = torch.cuda.is_available()
    size = ["--model.preset=mini", "--train.batch_size=64"] if gpu else \
        ["--model.preset=tiny", "--model.hidden_size=64", "--model.num_heads=2", "--model.intermediate_size=128",
         "--train.batch_size=8"]
    rows = {}
    for det in (False, True):
        digests, rates = [], []
        for i in range(2):
            run = out / f"det{int(det)}-{i}"
            cmd = [sys.executable, "-m", "bertkit", "pretrain", f"--out={run}", f"--data.path={out / 'data'}",
                   *size, "--model.position_embedding_type=alibi", "--model.norm_position=pre",
                   "--model.hidden_dropout=0", "--model.attention_dropout=0", f"--train.max_steps={updates}",
                   "--train.eval_every=0", "--train.checkpoint_every=0", "--train.progress=false",
                   "--data.eval_instances=64", f"--train.deterministic={str(det).lower()}"]
            t = time.perf_counter()
            r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            wall = time.perf_counter() - t
            if r.returncode != 0:
                rows[f"deterministic={det}"] = {"error": r.stderr[-1500:]}
                break
            card = json.loads((run / "run_card.json").read_text())
            digests.append(hashlib.sha256((run / "final" / "model.safetensors").read_bytes()).hexdigest()[:16])
            rates.append(card["updates"] / max(card["wall_time_s"], 1e-9))
            rows[f"deterministic={det}"] = {"identical_weights": len(set(digests)) == 1, "sha256": digests,
                                            "updates_per_s": [round(x, 2) for x in rates], "process_wall_s": round(wall, 1),
                                            "card": card.get("deterministic"), "precision": card.get("precision")}
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--updates", type=int, default=200)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"torch": torch.__version__, "cuda": torch.version.cuda,
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "cudnn_sdpa_nan": cudnn_nan_check(), "pretrain_twice": pretrain_twice(out, a.updates)}
    (out / "gpu_determinism.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
