"""Held-out MLM accuracy against wall time: bertkit recipes side by side with transformers' Trainer.

What a user of a CPU cares about is not steps per second but how much the model knows after N
minutes. This benchmark trains each recipe for the same wall time on the same corpus, the same
tokenizer and the same held-out *documents* (never trained on), and records held-out MLM accuracy
as it goes; the anchor is transformers' `BertForMaskedLM` trained with its `Trainer` and
`DataCollatorForLanguageModeling`, as `examples/pytorch/language-modeling/run_mlm.py` does with its
defaults (lr 5e-5, AdamW, linear decay, no warm-up, batch 8, 15% masking, texts concatenated and cut
into 128-token blocks, fp32), with the model shape of the first recipe.

Both sides are scored on the same masked held-out batches (bertkit's collator over the prepared
evaluation split, seed fixed), and time spent evaluating is not counted on either side.

    python benchmarks/pretrain_quality.py --minutes 5 \
        --recipes configs/pretrain/cpu-5m.yaml,configs/pretrain/tiny.yaml --hf --out runs/quality

`--corpus` takes text files (one sentence per line, a blank line between documents); the default is
the bundled inaugural addresses. Writes OUT/curves.png (accuracy vs minutes, one line per recipe),
OUT/results.jsonl, and prints a JSON summary last: for each recipe its final accuracy and the minutes
it took to reach the anchor's final accuracy (`speedup_to_anchor` = anchor minutes / recipe minutes).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def corpus(args, out: Path) -> list[str]:
    if args.corpus:
        return [str(Path(p).resolve()) for p in args.corpus.split(",")]
    path = out / "inaugural.txt"
    if not path.exists():
        path.write_bytes(gzip.decompress((resources.files("bertkit") / "sample" / "inaugural.txt.gz").read_bytes()))
    return [str(path)]


def split_corpus(files: list[str], out: Path, n_eval: int) -> tuple[Path, Path]:
    """Whole documents, n_eval of them evenly spaced through the corpus, held out: train.txt, heldout.txt."""
    train, held = out / "train.txt", out / "heldout.txt"
    if train.exists() and held.exists():
        return train, held
    docs: list[str] = []
    for f in files:
        opener = gzip.open if f.endswith(".gz") else open
        with opener(f, "rt", encoding="utf-8") as fh:
            docs += [d.strip() for d in fh.read().split("\n\n") if d.strip()]
    if len(docs) < n_eval + 2:
        sys.exit(f"{files}: {len(docs)} documents, too few to hold {n_eval} out")
    picked = {round(i * (len(docs) - 1) / max(n_eval - 1, 1)) for i in range(n_eval)} if n_eval > 1 else {len(docs) - 1}
    train.write_text("\n\n".join(d for i, d in enumerate(docs) if i not in picked) + "\n", encoding="utf-8")
    held.write_text("\n\n".join(d for i, d in enumerate(docs) if i in picked) + "\n", encoding="utf-8")
    return train, held


def prepare_data(train: Path, held: Path, out: Path, vocab_size: int, seq: int, nsp: bool) -> tuple[Path, Path, Path]:
    """One tokenizer (trained on the training documents) for every recipe; prepared folders per (length, NSP)."""
    from bertkit import Tokenizer
    from bertkit.data.prepare import PrepareConfig, prepare

    tok_dir = out / "tokenizer"
    if not (tok_dir / "vocab.txt").exists():
        Tokenizer.train([str(train)], vocab_size=vocab_size, lowercase=True).save(tok_dir)
    tok = Tokenizer.from_dir(tok_dir)
    folders = []
    for name, src in (("train", train), ("heldout", held)):
        data = out / f"data-{seq}-{'nsp' if nsp else 'full'}" / name
        if not (data / "meta.json").exists():
            prepare([str(src)], tok, data, PrepareConfig(max_length=seq, nsp=nsp, eval_documents=0, seed=0),
                    progress=False, overwrite=True)
        folders.append(data)
    return tok_dir, folders[0], folders[1]


def recipe_settings(spec: str) -> dict:
    """'configs/pretrain/cpu-5m.yaml@64' -> the config, its sequence length (default 128) and NSP setting."""
    import yaml

    path, _, seq = spec.partition("@")
    cfg = yaml.safe_load(Path(path).read_text()) or {}
    return {"path": str(Path(path).resolve()), "name": Path(path).stem + (f"@{seq}" if seq else ""),
            "seq": int(seq or 128), "nsp": bool((cfg.get("train") or {}).get("nsp", True)),
            "preset": (cfg.get("model") or {}).get("preset", "mini")}


def bertkit_command(r: dict, data: Path, held: Path, out: Path, minutes: float, threads: int, evals: int) -> list[str]:
    run = out / "runs" / r["name"]
    return [sys.executable, "-m", "bertkit", "pretrain", r["path"], f"--out={run}", f"--data.path={data}",
           f"--data.eval_path={held}", "--data.eval_instances=512", f"--train.budget={minutes * 60:.0f}s",
           "--train.max_steps=10000000", "--train.checkpoint_every=0", f"--train.eval_minutes={minutes / evals:.4f}",
           "--train.eval_every=0", f"--train.threads={threads}", "--train.progress=false"]


def bertkit_rows(r: dict, out: Path) -> list[dict]:
    run = out / "runs" / r["name"]
    rows = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines() if line.strip()]
    card = json.loads((run / "run_card.json").read_text())
    return [{"recipe": r["name"], "minutes": e.get("elapsed_s", 0.0) / 60, "step": e["step"], "tokens": e.get("tokens"),
             "accuracy": e["eval_mlm_accuracy"], "mask_accuracy": e.get("eval_mask_accuracy"),
             "loss": e["eval_mlm_loss"], "precision": card.get("precision")}
            for e in rows]


def eval_batches(held: Path, n: int = 512, batch_size: int = 32) -> list[dict]:
    """The first n held-out instances, masked once with a fixed seed (token masking, 15%, 80/10/10)."""
    from bertkit.data.masking import Collator
    from bertkit.data.pretraining import open_dataset

    ds = open_dataset(held)
    n = min(n, len(ds))
    coll = Collator(ds, seed=1)
    return [coll([ds[i] for i in range(s, min(s + batch_size, n))], epoch=0) for s in range(0, n, batch_size)]


def run_hf(train: Path, tok_dir: Path, held: Path, preset: str, minutes: float, threads: int, evals: int,
           seq: int) -> list[dict]:
    """transformers' run_mlm.py recipe (its defaults), stopped after `minutes` of training time."""
    import torch
    from transformers import (BertConfig, BertForMaskedLM, BertTokenizerFast, DataCollatorForLanguageModeling,
                              Trainer, TrainerCallback, TrainingArguments)

    from bertkit.config import preset as bk_preset

    torch.set_num_threads(threads)
    tok = BertTokenizerFast.from_pretrained(str(tok_dir))
    shape = bk_preset(preset, vocab_size=tok.vocab_size)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=shape.hidden_size, num_hidden_layers=shape.num_layers,
                     num_attention_heads=shape.num_heads, intermediate_size=shape.intermediate_size,
                     max_position_embeddings=512)
    torch.manual_seed(42)
    model = BertForMaskedLM(cfg)
    lines = [ln for ln in train.read_text(encoding="utf-8").splitlines() if ln.strip()]
    ids: list[int] = []                 # run_mlm's group_texts: concatenate, cut into seq-token blocks
    for row in tok(lines)["input_ids"]:
        ids.extend(row)
    dataset = [{"input_ids": ids[i:i + seq]} for i in range(0, len(ids) - seq + 1, seq)]
    batches = eval_batches(held)
    rows: list[dict] = []

    def score(step: int, train_s: float):
        model.eval()
        correct = total = at_mask = masks = 0
        with torch.no_grad():
            for b in batches:
                logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                               token_type_ids=b["token_type_ids"]).logits
                keep = b["mlm_labels"] != -100
                right = logits[keep].argmax(-1) == b["mlm_labels"][keep]
                shown = b["input_ids"][keep] == tok.mask_token_id            # the 80% replaced by [MASK]
                correct += right.sum().item()
                total += keep.sum().item()
                at_mask += right[shown].sum().item()
                masks += shown.sum().item()
        model.train()
        rows.append({"recipe": "transformers Trainer (run_mlm defaults)", "minutes": train_s / 60, "step": step,
                     "accuracy": correct / max(total, 1), "mask_accuracy": at_mask / max(masks, 1),
                     "precision": "float32"})

    class Clock(TrainerCallback):
        def __init__(self):
            self.train_s, self.t, self.next = 0.0, None, minutes * 60 / evals

        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.train_s += time.perf_counter() - self.t
            if self.train_s >= self.next or self.train_s >= minutes * 60:
                score(state.global_step, self.train_s)
                self.next += minutes * 60 / evals
            if self.train_s >= minutes * 60:
                control.should_training_stop = True

    score(0, 0.0)
    targs = TrainingArguments(output_dir=str(held.parent.parent / "hf-run"), per_device_train_batch_size=8,
                              num_train_epochs=1000, learning_rate=5e-5, save_strategy="no", report_to=[],
                              logging_strategy="no", use_cpu=True, seed=42, disable_tqdm=True,
                              dataloader_num_workers=0)
    Trainer(model=model, args=targs, train_dataset=dataset, callbacks=[Clock()],
            data_collator=DataCollatorForLanguageModeling(tok, mlm_probability=0.15)).train()
    return rows


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name in dict.fromkeys(r["recipe"] for r in rows):
        pts = [r for r in rows if r["recipe"] == name]
        ax.plot([r["minutes"] for r in pts], [r["accuracy"] for r in pts], marker="o", ms=3, label=name)
    ax.set_xlabel("training minutes (evaluation not counted)")
    ax.set_ylabel("held-out MLM accuracy (held-out documents)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def minutes_to_reach(rows: list[dict], target: float) -> float | None:
    for r in rows:
        if r["accuracy"] >= target:
            return r["minutes"]
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipes", default="configs/pretrain/cpu-5m.yaml")
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--hf", action="store_true", help="also train the transformers Trainer anchor")
    ap.add_argument("--corpus", default=None)
    ap.add_argument("--eval-documents", type=int, default=5)
    ap.add_argument("--vocab-size", type=int, default=8000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--evals", type=int, default=15, help="evaluation points per run")
    ap.add_argument("--parallel", action="store_true",
                    help="run every contender at the same time, --threads each (needs that many cores per contender)")
    ap.add_argument("--out", default="runs/quality")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    files = corpus(args, out)
    from bertkit.hardware import machine_facts

    hw = machine_facts()
    rows: list[dict] = []
    recipes = [recipe_settings(r) for r in args.recipes.split(",") if r]
    train, held_text = split_corpus(files, out, args.eval_documents)
    # one held-out set for every contender: the held-out documents as full-sentence sequences of the
    # first recipe's length (an NSP recipe is scored on the same sequences; its NSP head is not used)
    tok_dir, _, held = prepare_data(train, held_text, out, args.vocab_size, recipes[0]["seq"], False)
    for r in recipes:
        _, data, _ = prepare_data(train, held_text, out, args.vocab_size, r["seq"], r["nsp"])
        r["command"] = bertkit_command(r, data, held, out, args.minutes, args.threads, args.evals)
    if args.parallel:       # every contender at once, `--threads` each: same machine, same minutes
        procs = [subprocess.Popen(r["command"], cwd=REPO) for r in recipes]
        hf_rows = run_hf(train, tok_dir, held, recipes[0]["preset"], args.minutes, args.threads, args.evals,
                         recipes[0]["seq"]) if args.hf else []
        if any(p.wait() for p in procs):
            sys.exit("a bertkit run failed (see its output above)")
    else:
        for r in recipes:
            subprocess.run(r["command"], check=True, cwd=REPO)
        hf_rows = run_hf(train, tok_dir, held, recipes[0]["preset"], args.minutes, args.threads, args.evals,
                         recipes[0]["seq"]) if args.hf else []
    for r in recipes:
        rows += bertkit_rows(r, out)
    rows += hf_rows
    with open(out / "results.jsonl", "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    title = (f"held-out MLM accuracy vs training time, {args.minutes:g} min each, {args.threads} thread(s)"
             f"{' each, run side by side' if args.parallel else ''}\n"
             f"{hw.get('cpu', '?')} | {time.strftime('%Y-%m-%d')} | commit {commit}")
    plot(rows, out / "curves.png", title)
    summary: dict = {"cpu": hw.get("cpu"), "date": time.strftime("%Y-%m-%d"), "commit": commit,
                     "threads_each": args.threads, "side_by_side": args.parallel, "recipes": {}}
    anchor = [r for r in rows if r["recipe"].startswith("transformers")]
    anchor_final = anchor[-1]["accuracy"] if anchor else None
    for name in dict.fromkeys(r["recipe"] for r in rows):
        pts = [r for r in rows if r["recipe"] == name]
        entry = {"final_accuracy": round(pts[-1]["accuracy"], 4), "minutes": round(pts[-1]["minutes"], 2),
                 "final_mask_accuracy": None if pts[-1].get("mask_accuracy") is None else round(pts[-1]["mask_accuracy"], 4),
                 "precision": pts[-1].get("precision")}
        if anchor_final is not None and not name.startswith("transformers"):
            reach = minutes_to_reach(pts, anchor_final)
            entry["minutes_to_anchor_final"] = round(reach, 2) if reach is not None else None
            entry["speedup_to_anchor"] = round(anchor[-1]["minutes"] / reach, 1) if reach else None
        summary["recipes"][name] = entry
    print(f"curves: {out / 'curves.png'}")
    print(json.dumps(summary))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
