"""`bertkit quickstart`: tokenizer, prepared data, a short pre-training run and its report, end to end."""
from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from bertkit.cli import main
from bertkit.quickstart import CLOZE, QUICKSTART_RECIPE

REPO = Path(__file__).resolve().parents[1]


def test_quickstart_runs_end_to_end(tmp_path, capsys):
    out = tmp_path / "qs"
    assert main(["quickstart", "--out", str(out), "--minutes", "0.5"]) == 0
    text = capsys.readouterr().out
    assert "held-out MLM accuracy" in text and f"cloze prompts: " in text and f"of {len(CLOZE)} answered" in text
    excerpt = documented_excerpt()                         # README's and docs/pretrain.md's, of the recorded run
    assert len(excerpt) >= 4
    for line in excerpt:                                   # today's output has the shape the docs show
        assert any(shape(line) == shape(ln) for ln in text.splitlines()), line
    assert text.count("held-out MLM accuracy") == 1                        # one summary
    next_line = next(line for line in text.splitlines() if line.startswith("next:"))
    assert "..." not in next_line and "[MASK]" in next_line                # a command that can be pasted
    card = json.loads((out / "run" / "run_card.json").read_text())
    assert card["stop_reason"].startswith("budget: ") and card["updates"] == card["planned_updates"] >= 1
    assert f"repeat:    bertkit quickstart --out {out} --seed 0 --updates {card['updates']}" in text
    assert card["config"]["data"]["eval_path"].endswith("heldout")
    assert card["config"]["model"]["norm_position"] == QUICKSTART_RECIPE["model.norm_position"]
    evals = [json.loads(x) for x in (out / "run" / "eval.jsonl").read_text().splitlines()]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == card["updates"]
    assert evals[-1]["eval_mlm_loss"] < evals[0]["eval_mlm_loss"]            # it learned something
    assert 0.0 <= evals[-1]["eval_mask_accuracy"] <= 1.0                     # the [MASK]-only accuracy too
    assert "at the [MASK] tokens alone" in text
    assert "pace: " in text and "x the documented run" in text
    hour = next(line for line in text.splitlines() if "bertkit pretrain configs/pretrain/cpu-60m" in line)
    recipe = hour.split("bertkit pretrain ")[1].split()[0]
    assert (REPO / recipe).exists() and str(out / "data" / "train") in hour
    assert recipe.endswith("cpu-60m-avx2.yaml") == (card["precision"] == "float32")   # the recipe for this CPU
    for f in ("tokenizer/vocab.txt", "data/train/meta.json", "data/heldout/meta.json", "run/curves.png",
              "run/run_card.md", "run/final/model.safetensors", "run/final/vocab.txt"):
        assert (out / f).exists(), f


def documented_excerpt() -> list[str]:
    """The lines of the documented quickstart's summary that README.md and docs/pretrain.md show (the
    text blocks marked `docs-test: recorded (...quickstart...)`; tests/test_docs.py checks them against
    the recorded file)."""
    lines = []
    for page in (REPO / "README.md", REPO / "docs" / "pretrain.md"):
        text = page.read_text(encoding="utf-8")
        for block in re.findall(r"docs-test: recorded \(benchmarks/results/quickstart[^)]*\) -->\n```text\n(.*?)\n```",
                                text, flags=re.S):
            lines += [ln for ln in block.split("\n") if ln.strip()]
    return lines


def shape(line: str) -> str:
    """A summary line with its numbers, precision and cloze answers left out."""
    if re.match(r"  [+-] ", line):                         # a cloze line: its prompt, not whether or what it answered
        line = "  ? " + line[4:81]
    return re.sub(r"\d[\d,.]*", "N", re.sub(r"\b(bfloat16|float32|float16)\b", "P", line.rstrip()))


def test_pace_note_says_how_many_minutes_a_slower_cpu_needs():
    """On a CPU at a third of the documented run's rate, the quickstart says so and how many
    --minutes see as many tokens; at the documented rate it only states the pace."""
    from bertkit.quickstart import REFERENCE_RUN, pace_note

    ref = REFERENCE_RUN["tokens_per_s"]
    fast = pace_note({"tokens_per_s": ref, "precision": "bfloat16"}, other_s=20)
    assert fast.startswith("pace: ") and "1.00x the documented run" in fast and "--minutes" not in fast
    slow = pace_note({"tokens_per_s": ref / 3, "precision": "float32"}, other_s=30)
    minutes = int(slow.rsplit("--minutes ", 1)[1])
    assert "0.33x" in slow and "float32" in slow
    assert minutes * 60 >= REFERENCE_RUN["tokens"] / (ref / 3) + 30 > (minutes - 1) * 60
    assert "--minutes" not in pace_note({"tokens_per_s": 0.0, "precision": "float32"}, other_s=5)


def test_pace_reference_is_the_documented_run():
    """The run the pace line compares against is the one docs/pretrain.md and its run card record."""
    from bertkit.quickstart import REFERENCE_RUN

    card = (REPO / "benchmarks" / "results" / "quickstart-kernel-2026-12-01" / "run_card.md").read_text()
    row = lambda key: next(ln for ln in card.splitlines() if ln.startswith(f"| {key} |")).split("|")[2].strip()  # noqa: E731
    assert int(row("tokens").replace(",", "")) == REFERENCE_RUN["tokens"]
    assert abs(float(row("tokens_per_s")) / REFERENCE_RUN["tokens_per_s"] - 1) < 0.01
    assert abs(float(row("eval_mlm_accuracy")) - REFERENCE_RUN["accuracy"]) < 0.0006
    doc = (REPO / "docs" / "pretrain.md").read_text()
    assert f"held-out **{REFERENCE_RUN['accuracy']:.3f}**" in doc and f"**{REFERENCE_RUN['hits']} of 8** cloze" in doc


def test_quickstart_runs_the_documented_cpu_recipe():
    """configs/pretrain/cpu-5m.yaml is the quickstart's recipe, value for value."""
    cfg = yaml.safe_load((REPO / "configs" / "pretrain" / "cpu-5m.yaml").read_text())
    for key, value in QUICKSTART_RECIPE.items():
        section, name = key.split(".")
        assert cfg[section][name] == value, key


def test_quickstart_corpus_holds_out_whole_documents_of_both_sources():
    """The held-out documents are whole addresses and whole book passages, none of them trained on."""
    from bertkit.quickstart import quickstart_corpus

    train, held, about = quickstart_corpus()
    assert "inaugural" in about and "Gutenberg" in about
    assert not set(train) & set(held)
    assert len(held) >= 10 and len(train) > 10 * len(held)
    assert any("Bush" in d or "Clinton" in d for d in held)                 # the last addresses
    train_lines = {ln for d in train for ln in d.splitlines() if len(ln) > 60}
    held_lines = [ln for d in held for ln in d.splitlines() if len(ln) > 60]
    assert sum(ln in train_lines for ln in held_lines) < 0.01 * len(held_lines)


def test_the_hour_suggested_after_the_quickstart_fits_the_precision_that_ran():
    """fp32 training (an AVX2-only CPU) is pointed at the narrower hour, bf16 or fp16 at BERT-mini's;
    both configs exist and load."""
    from bertkit.quickstart import hour_recipe
    from bertkit.runconfig import PretrainConfig, load_config

    assert hour_recipe("float32").endswith("cpu-60m-avx2.yaml")
    assert hour_recipe("bfloat16").endswith("cpu-60m.yaml") and hour_recipe("float16").endswith("cpu-60m.yaml")
    for p in {hour_recipe("float32"), hour_recipe("bfloat16")}:
        load_config(PretrainConfig, REPO / p)


def test_quickstart_repeats_bit_for_bit_with_the_recorded_updates(tmp_path, capsys):
    # a timed quickstart's card names its number of updates; --updates N reruns it exactly
    first, again = tmp_path / "first", tmp_path / "again"
    assert main(["quickstart", "--out", str(first), "--updates", "6"]) == 0
    assert main(["quickstart", "--out", str(again), "--updates", "6"]) == 0
    capsys.readouterr()
    for run in (first, again):
        card = json.loads((run / "run" / "run_card.json").read_text())
        assert card["updates"] == 6 and card["stop_reason"] == "max_steps" and card["planned_updates"] is None
    assert (first / "run" / "final" / "model.safetensors").read_bytes() == \
        (again / "run" / "final" / "model.safetensors").read_bytes()


HIDE_EXTRAS = """
import importlib.machinery, sys
HIDDEN = set(sys.argv[1].split(","))
class Hidden(importlib.machinery.PathFinder):    # the path finder, blind to the extras: as if not installed
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        return importlib.machinery.PathFinder.find_spec(name, path, target)
sys.meta_path[:] = [Hidden if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
from bertkit.cli import main
code = main(sys.argv[2:])
loaded = HIDDEN & {m.partition(".")[0] for m in sys.modules}
assert not loaded, loaded
sys.exit(code)
"""


def extra_only_modules() -> set[str]:
    """The top-level modules that only bertkit's extras install (transformers, onnxruntime, matplotlib, ...)."""
    import importlib.metadata as md
    import re

    norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()  # noqa: E731
    reqs = md.requires("bertkit") or []
    name = lambda req: norm(re.match(r"[A-Za-z0-9_.-]+", req).group(0))  # noqa: E731
    core = {name(r) for r in reqs if "extra ==" not in r}
    extra = {name(r) for r in reqs if "extra ==" in r} - core
    return {module for module, dists in md.packages_distributions().items()
            if dists and all(norm(d) in extra for d in dists)}


def test_quickstart_runs_on_the_plain_install(tmp_path):
    """`pip install -e .` (no extras) is enough for the README's first command: the quickstart runs
    with every extra-only package hidden, none of them is loaded, and the summary says the curves
    need the plot extra."""
    import os
    import subprocess
    import sys

    hidden = extra_only_modules()
    assert {"transformers", "onnxruntime", "matplotlib", "sentence_transformers"} <= hidden
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", HIDE_EXTRAS, ",".join(sorted(hidden)), "quickstart",
                        "--out", str(tmp_path / "qs"), "--updates", "1", "--threads", "1"],
                       capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "held-out MLM accuracy" in r.stdout and "cloze prompts: " in r.stdout
    assert "curves:    not drawn: matplotlib is not installed (pip install 'bertkit[plot]')" in r.stdout
    assert (tmp_path / "qs" / "run" / "final" / "model.safetensors").exists()
