"""`bertkit predict` / `evaluate` on a checkpoint: config.json is read once and handed down (to the
Predictor's loader and the task's settings), whatever the head."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import bertkit.checkpoint
from bertkit import Tokenizer, preset, save_model
from bertkit.checkpoint import build
from bertkit.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")    # conftest: tiny models, one thread

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "the", "movie", "was", "."]


def checkpoint(path: Path, head: str, **extra) -> Path:
    """A tiny checkpoint of `head` with its tokenizer (random weights: only the plumbing is tested)."""
    torch.manual_seed(0)
    cfg = preset("tiny", vocab_size=len(WORDS), hidden_size=32, num_heads=2, intermediate_size=64,
                 max_position_embeddings=64)
    args = {"num_labels": 2} if head == "sequence_classification" else {}
    save_model(build(head, cfg, **args), path, extra_config=extra)
    Tokenizer({t: i for i, t in enumerate(WORDS)}, lowercase=True).save(path)
    return path


@pytest.fixture
def reads(monkeypatch) -> list[Path]:
    """Every `checkpoint.read_config` call from here on (callers import it when they run)."""
    calls: list[Path] = []
    real = bertkit.checkpoint.read_config

    def counted(path):
        calls.append(Path(path))
        return real(path)

    monkeypatch.setattr(bertkit.checkpoint, "read_config", counted)
    return calls


@pytest.mark.parametrize("head, extra, line", [
    ("sequence_classification", {"id2label": {"0": "neg", "1": "pos"}, "bertkit_task": {"name": "sst2"},
                                 "bertkit_max_length": 32}, {"text": "the movie was good"}),
    ("masked_lm", {}, {"text": "the movie was [MASK] ."}),
])
def test_predict_reads_config_json_once(tmp_path, capsys, reads, head, extra, line):
    model = checkpoint(tmp_path / "m", head, **extra)
    (tmp_path / "in.jsonl").write_text(json.dumps(line) + "\n", encoding="utf-8")
    assert main(["predict", "--model", str(model), str(tmp_path / "in.jsonl"), "--top-k", "2"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["id"] == "0" and row["prediction"]
    assert reads == [model]


def test_evaluate_reads_config_json_once(tmp_path, capsys, reads):
    model = checkpoint(tmp_path / "m", "sequence_classification", id2label={"0": "0", "1": "1"},
                       bertkit_task={"name": "sst2"}, bertkit_max_length=32)
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\nthe movie was good\t1\nbad movie\t0\n", encoding="utf-8")
    assert main(["evaluate", "--model", str(model), "--data", str(tmp_path / "dev.tsv"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["examples"] == 2
    assert reads == [model]


# ---- the walk of a batch --------------------------------------------------------------------------
def predict_walk(model: Path, inputs: Path) -> list[tuple[str, list[str]]]:
    """The rooms (files of src/bertkit) a reader passes through following `bertkit predict` from the
    command to the head's outputs, in order, with the functions called in each.

    Every call into bertkit is traced. The spine is the chain of frames at the first call of a head's
    `outputs` (model.py), from the command's `run_predict` down; a reader reads the spine's functions
    and, within a file, the same-file functions they call. Each call from a function read into
    another file is a step into that room (what the callee calls is not followed unless it is on
    the spine); steps into the same room one after another are one visit."""
    import inspect
    import sys

    src = Path(bertkit.__file__).resolve().parent
    events: list[tuple[int | None, str, str, bool]] = []     # (caller's index, room, function, is a function)
    stack: list[int] = []

    def room(code) -> str | None:
        try:
            return str(Path(code.co_filename).resolve().relative_to(src))
        except ValueError:
            return None

    def profile(frame, event, arg):
        if event in ("call", "return") and (r := room(frame.f_code)) is not None:
            if event == "call":
                code = frame.f_code
                events.append((stack[-1] if stack else None, r, code.co_qualname,
                               bool(code.co_flags & inspect.CO_OPTIMIZED)))     # not a module or class body
                stack.append(len(events) - 1)
            elif stack:
                stack.pop()

    sys.setprofile(profile)
    try:
        assert main(["predict", "--model", str(model), str(inputs)]) == 0
    finally:
        sys.setprofile(None)
    end = next(i for i, (_, r, name, _) in enumerate(events) if r == "model.py" and name.endswith(".outputs"))
    spine, i = set(), end
    while i is not None:
        spine.add(i)
        i = events[i][0]
    top = next(i for i in sorted(spine) if events[i][2] == "run_predict")
    read, steps = {top}, [("cli.py", "main"), events[top][1:3]]
    for i in range(top + 1, end + 1):
        caller, r, name, is_function = events[i]
        if caller in read and is_function:
            if r != events[caller][1]:
                steps.append((r, name))
            if i in spine or r == events[caller][1]:
                read.add(i)
    walk: list[tuple[str, list[str]]] = []
    for r, name in steps:
        if walk and walk[-1][0] == r:
            walk[-1][1].extend([name] if name not in walk[-1][1] else [])
        else:
            walk.append((r, [name]))
    return walk


def test_the_walk_of_a_batch_from_predict_to_the_head(tmp_path, capsys):
    """Issue 33's walk: prediction never steps into fine-tuning, and every room but the Predictor's
    (loaded, then run) is entered once. Before the task plumbing moved out of finetune.py the walk
    was 10 rooms in 12 steps, back into checkpoint.py, finetune.py and infer.py."""
    model = checkpoint(tmp_path / "m", "sequence_classification", id2label={"0": "neg", "1": "pos"},
                       bertkit_task={"name": "sst2"}, bertkit_max_length=32)
    (tmp_path / "in.jsonl").write_text('{"text": "the movie was good"}\n', encoding="utf-8")
    walk = predict_walk(model, tmp_path / "in.jsonl")
    rooms = [r for r, _ in walk]
    said = "the walk:\n" + "\n".join(f"{r:22s} {', '.join(names)}" for r, names in walk)
    assert rooms[:5] == ["cli.py", "commands/predict.py", "sources.py", "commands/basic.py",   # flags -> PredictorOptions
                         "predict.py"] and rooms[-1] == "model.py", said
    assert "finetune.py" not in rooms and "tasks/plumbing.py" in rooms, said
    assert [r for i, r in enumerate(rooms) if r in rooms[:i]] == ["infer/predictor.py"], said   # from_dir, then outputs
    assert len(set(rooms)) <= 10, said


def test_predict_and_evaluate_options_import_no_fine_tuning():
    """`bertkit predict --help` and `evaluate --help` build their options without fine-tuning's modules
    (commands/predict.py; the column options are `tasks.plumbing.Columns`)."""
    import subprocess
    import sys

    code = ("import sys; from bertkit.cli import build_parser; build_parser('predict'); build_parser('evaluate'); "
            "print(sorted(m for m in sys.modules if m.startswith(('bertkit.finetune', 'bertkit.commands.finetune'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


if __name__ == "__main__":          # python tests/test_predict.py: the walk, room by room
    import tempfile

    folder = Path(tempfile.mkdtemp())
    model = checkpoint(folder / "m", "sequence_classification", id2label={"0": "neg", "1": "pos"},
                       bertkit_task={"name": "sst2"}, bertkit_max_length=32)
    (folder / "in.jsonl").write_text('{"text": "the movie was good"}\n', encoding="utf-8")
    torch.set_num_threads(1)
    walk = predict_walk(model, folder / "in.jsonl")
    rooms = [r for r, _ in walk]
    for r, names in walk:
        print(f"  {r:22s} {', '.join(names)}")
    again = [r for i, r in enumerate(rooms) if r in rooms[:i]]
    print(f"{len(set(rooms))} rooms, {len(rooms) - 1} steps, entered again: {', '.join(again) or 'none'}")
