"""Issue 33's walks, traced: a batch of `bertkit predict` from the command reading its input to the
head's outputs, and one config value from its flag to the code that uses it.

A room is a file of src/bertkit; a hop is a call from one room into another. The walk is what a reader
opens following the code: every call into bertkit is traced (`sys.setprofile`); the spine is the chain
of frames at the first call of a head's `outputs` (model.py), from the command's `run_predict` down.
The reader reads the spine's functions and, within a file, the same-file functions they call; each
call from a function read into another file is a hop into that room (what the callee calls is not
followed unless it is on the spine: the encoder's forward, its prepacked layers and packed attention
run under the engine's `run`); hops into the same room one after another are one visit.

Two walks leave the batch's and are listed on their own: `load` (config.json read once, the Predictor
loaded, the checkpoint's task resolved: `read_config`, `predict.load_task_predictor`,
`Predictor.from_dir`) and `config` (the flags made into the options dataclasses,
`commands/basic.options_of`). `cli.py`'s `main`, the door, comes before the command.
docs/layout.md shows the walks; `python tests/test_walk.py` prints them.
"""
from __future__ import annotations

import argparse
import functools
import inspect
import json
import sys
from pathlib import Path

import pytest

import bertkit
from bertkit.cli import build_parser, main
from bertkit.cliconfig import field_docs
from bertkit.predict import PredictOptions
from test_predict import checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")    # conftest: tiny models, one thread

SRC = Path(bertkit.__file__).resolve().parent
LAYOUT = SRC.parents[1] / "docs" / "layout.md"
OTHER_WALKS = {"options_of": "config", "predictor_options": "config",       # flags -> options dataclasses
               "read_config": "load", "load_task_predictor": "load",      # config.json -> Predictor + task
               "from_dir": "load"}
Walk = list[tuple[str, list[str]]]                     # (room, the functions called there), in order


def room(code) -> str | None:
    return _room(code.co_filename)


@functools.cache
def _room(filename: str) -> str | None:
    try:
        return str(Path(filename).resolve().relative_to(SRC))
    except ValueError:
        return None


def visits(steps: list[tuple[str, str]]) -> Walk:
    """Hops into the same room one after another are one visit."""
    walk: Walk = []
    for r, name in steps:
        if walk and walk[-1][0] == r:
            walk[-1][1].extend([name] if name not in walk[-1][1] else [])
        else:
            walk.append((r, [name]))
    return walk


def predict_walks(model: Path, inputs: Path) -> dict[str, Walk]:
    """The batch's walk and the two beside it (`config`, `load`) of `bertkit predict --model model inputs`."""
    events: list[tuple[int | None, str, str, bool]] = []     # (caller's index, room, function, is a function)
    stack: list[int] = []

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

    def chain(i: int | None) -> list[int]:
        out = []
        while i is not None:
            out.append(i)
            i = events[i][0]
        return out

    def walk_name(i: int) -> str:
        return OTHER_WALKS.get(events[i][2].rsplit(".", 1)[-1], "batch")

    end = next(i for i, (_, r, name, _) in enumerate(events) if r == "model.py" and name.endswith(".outputs")
               and all(walk_name(j) == "batch" for j in chain(i)))
    spine = set(chain(end))
    top = next(i for i in sorted(spine) if events[i][2] == "run_predict")
    read, walk_of = {top}, {top: "batch"}
    steps: dict[str, list[tuple[str, str]]] = {"batch": [events[top][1:3]], "load": [], "config": []}
    for i in range(top + 1, end + 1):
        caller, r, name, is_function = events[i]
        if caller not in read or not is_function:
            continue
        walk = walk_of[caller] if walk_name(i) == "batch" else walk_name(i)
        if r != events[caller][1]:
            steps[walk].append((r, name))
        if i in spine or r == events[caller][1]:
            read.add(i)
            walk_of[i] = walk
    return {"door": [("cli.py", ["main"])], **{k: visits(v) for k, v in steps.items()}}


def rooms(walk: Walk) -> list[str]:
    return [r for r, _ in walk]


def again(walk: Walk) -> list[str]:
    """Rooms entered a second time after the walk left them."""
    rs = rooms(walk)
    return [r for i, r in enumerate(rs) if r in rs[:i]]


def shown(walks: dict[str, Walk]) -> str:
    """The walks as docs/layout.md shows them: one line of rooms each, then the functions per room."""
    lines = []
    for name, walk in walks.items():
        lines.append(f"{name}: " + " -> ".join(rooms(walk)))
        lines += [f"    {r:22s} {', '.join(names)}" for r, names in walk]
    return "\n".join(lines)


CLASSIFIER = ("sequence_classification", {"id2label": {"0": "neg", "1": "pos"}, "bertkit_task": {"name": "sst2"},
                                          "bertkit_max_length": 32})


def predict_case(folder: Path, lines: list[dict], head: str = CLASSIFIER[0], extra: dict = CLASSIFIER[1]):
    """A tiny checkpoint of `head` (a fine-tuned sst2 classifier by default) and an input file of `lines`."""
    model = checkpoint(folder / "m", head, **extra)
    (folder / "in.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return model, folder / "in.jsonl"


def test_the_walk_of_a_batch_from_predict_to_the_head(tmp_path, capsys):
    """Issue 33's goal on a fine-tuned classifier: at most 7 rooms, none entered again, no fine-tuning
    on any walk; docs/layout.md shows the walks as traced. Before the task plumbing moved out of
    finetune.py, the whole command (flags and loading included) was 10 rooms in 12 steps, back into
    checkpoint.py, finetune.py and infer.py."""
    walks = predict_walks(*predict_case(tmp_path, [{"text": "the movie was good"}]))
    said = shown(walks)
    batch = rooms(walks["batch"])
    assert batch[:3] == ["commands/predict.py", "sources.py", "predict.py"] and batch[-1] == "model.py", said
    assert len(set(batch)) <= 7 and not again(walks["batch"]), said
    assert rooms(walks["config"]) == ["commands/basic.py"], said
    assert not again(walks["load"]) and "infer/predictor.py" in rooms(walks["load"]), said
    assert not any(r.startswith("finetune") for w in walks.values() for r in rooms(w)), said
    shown_lines = set(LAYOUT.read_text(encoding="utf-8").splitlines())   # docs/layout.md shows the walks as they are
    missing = [line for line in shown({k: walks[k] for k in ("batch", "load", "config")}).splitlines()
               if line not in shown_lines]
    assert not missing, "docs/layout.md lacks the lines\n" + "\n".join(missing) + "\n\nthe walks:\n" + said


@pytest.mark.parametrize("head, extra, line", [
    ("token_classification", {"id2label": {"0": "O", "1": "B-PER"}, "bertkit_task": {"name": "conll2003"}},
     {"tokens": ["the", "movie"]}),
    ("question_answering", {"bertkit_task": {"name": "squad"}, "bertkit_max_length": 32},
     {"question": "the movie", "context": "the movie was good ."}),
    ("masked_lm", {}, {"text": "the movie was [MASK] ."}),
])
def test_the_walk_of_every_head(tmp_path, capsys, head, extra, line):
    """Tags, answers and [MASK] words walk as few rooms (a masked LM: no task, the Predictor tokenizes)."""
    walks = predict_walks(*predict_case(tmp_path, [line], head, extra))
    batch = rooms(walks["batch"])
    assert len(set(batch)) <= 7 and not again(walks["batch"]) and batch[-1] == "model.py", shown(walks)


def test_the_walk_of_a_config_value(tmp_path, capsys):
    """`--batch-size`: the flag is PredictOptions' field (its name, its doc as the help), the value is
    handed down as `batch_size` to the Predictor, which cuts its batches by it (`length_buckets`)."""
    commands = next(a for a in build_parser("predict")._actions if isinstance(a, argparse._SubParsersAction))
    flag = next(a for a in commands.choices["predict"]._actions if "--batch-size" in a.option_strings)
    assert flag.dest == "batch_size" and field_docs(PredictOptions)["batch_size"] in flag.help
    model, inputs = predict_case(tmp_path, [{"text": "the movie was good"}, {"text": "bad"}, {"text": "the movie"}])
    steps, cuts = [], []

    def profile(frame, event, arg):
        if (r := room(frame.f_code)) is None:
            return
        if event == "call" and "batch_size" in frame.f_code.co_varnames and frame.f_locals.get("batch_size") == 2:
            steps.append((r, frame.f_code.co_qualname))
        if event == "return" and frame.f_code.co_name == "length_buckets":
            cuts.append(arg)

    sys.setprofile(profile)
    try:
        assert main(["predict", "--model", str(model), str(inputs), "--batch-size", "2"]) == 0
    finally:
        sys.setprofile(None)
    assert len(capsys.readouterr().out.splitlines()) == 3
    walk = visits(steps)
    assert walk == [("predict.py", ["predict"]), ("infer/predictor.py", ["Predictor.outputs", "Predictor._run",
                                                                        "Predictor.batches"]),
                    ("infer/engines.py", ["make_batches", "length_buckets"])], walk
    assert [sorted(map(len, c)) for c in cuts] == [[1, 2]]


if __name__ == "__main__":          # python tests/test_walk.py: the walks, room by room
    import tempfile

    import torch

    torch.set_num_threads(1)
    walks = predict_walks(*predict_case(Path(tempfile.mkdtemp()), [{"text": "the movie was good"}]))
    print(shown(walks))
    for name, walk in walks.items():
        print(f"{name}: {len(set(rooms(walk)))} rooms, entered again: {', '.join(again(walk)) or 'none'}")
