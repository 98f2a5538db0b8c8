"""Nothing bertkit reads can run code: a malicious pickle planted in each file bertkit opens
(checkpoint state, RNG state, weights, tokenizer and config files, prepared data, YAML configs)
gives a one-line `bertkit CMD: error:` and never runs its payload.

The payload opens a marker file for writing when it is unpickled: `test_the_payloads_run_code_when_unpickled`
shows that each planted file does create the marker with an unsafe loader, so the other tests can fail.
"""
from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.cli import main
from test_pretrain import make_data, tiny_config


class _Payload:
    """Unpickling this calls open(marker, 'w'): code of the file's choosing runs."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def _torch_pickle(path: Path, marker: Path, wrap=lambda p: {"optimizer": p}) -> None:
    torch.save(wrap(_Payload(marker)), path)


def _plain_pickle(path: Path, marker: Path) -> None:
    path.write_bytes(pickle.dumps({"x": _Payload(marker)}))


def _npy_pickle(path: Path, marker: Path) -> None:
    np.save(path, np.array([_Payload(marker), 1], dtype=object), allow_pickle=True)


def _yaml_payload(path: Path, marker: Path) -> None:
    path.write_text(f"out: x\ntrain: !!python/object/apply:builtins.open [{json.dumps(str(marker))}, w]\n")


def _rewrite_manifest(ckpt: Path) -> None:
    """What an attacker who can write the run folder does too: make the checksums match again."""
    files = sorted(p for p in ckpt.rglob("*") if p.is_file() and p.name != "manifest.json")
    manifest = {"step": int(ckpt.name[5:]), "files": {str(p.relative_to(ckpt)): {
        "size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()} for p in files}}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """Prepared data, a 2-update run with its checkpoint, and its final model folder."""
    from bertkit.runconfig import save_config
    from bertkit.train import pretrain

    root = tmp_path_factory.mktemp("nopickle")
    data = make_data(root / "data", (64,))[64]
    cfg = tiny_config(data, root / "run", **{"train.max_steps": 2, "train.checkpoint_every": 2,
                                              "train.eval_every": 0})
    pretrain(cfg)
    save_config(cfg, root / "run.yaml")
    return {"root": root, "data": data, "run": root / "run", "config": root / "run.yaml"}


def _cli(args: list[str], capsys) -> tuple[int, str]:
    try:
        rc = main([str(a) for a in args])
    except SystemExit as e:              # argparse
        rc = e.code if isinstance(e.code, int) else 2
    except BaseException as e:           # a traceback: the test fails with what it was
        pytest.fail(f"bertkit {' '.join(map(str, args))}: {type(e).__name__}: {e}")
    return rc, capsys.readouterr().err


def _assert_refused(args, capsys, marker: Path, command: str) -> str:
    rc, err = _cli(args, capsys)
    assert not marker.exists(), f"the payload ran: {marker} was created"
    lines = [line for line in err.splitlines() if line.startswith(f"bertkit {command}: error:")]
    assert rc == 1 and len(lines) == 1, (rc, err[-2000:])
    assert "Traceback" not in err
    return lines[0]


# ---- pre-training resume: trainer and RNG state, both formats ------------------------------------
def _resume_case(built, tmp_path, plant) -> tuple[list, Path]:
    run = tmp_path / "run"
    shutil.copytree(built["run"], run)
    ckpt = run / "checkpoints" / "step-00000002"
    marker = tmp_path / "marker"
    plant(ckpt, marker)
    _rewrite_manifest(ckpt)
    return ["pretrain", built["config"], f"--out={run}", "--resume", "--train.max_steps=3"], marker


def _as_format_1(ckpt: Path) -> None:
    from bertkit.runstate import _read_trainer, load_state

    torch.save(_read_trainer(ckpt), ckpt / "trainer.pt")
    torch.save(load_state(ckpt / "rng-rank0.safetensors"), ckpt / "rng-rank0.pt")
    for name in ("trainer.json", "trainer.safetensors", "rng-rank0.safetensors"):
        (ckpt / name).unlink()


RESUME_PLANTS = {
    "trainer.safetensors as a pickle": lambda c, m: _torch_pickle(c / "trainer.safetensors", m),
    "rng-rank0.safetensors as a pickle": lambda c, m: _torch_pickle(c / "rng-rank0.safetensors", m),
    "trainer.json as a pickle": lambda c, m: _plain_pickle(c / "trainer.json", m),
    "model.safetensors as a pickle": lambda c, m: _torch_pickle(c / "model" / "model.safetensors", m),
    "pytorch_model.bin in the checkpoint's model": lambda c, m: (
        (c / "model" / "model.safetensors").unlink(), _torch_pickle(c / "model" / "pytorch_model.bin", m)),
    "old-format trainer.pt": lambda c, m: (_as_format_1(c), _torch_pickle(c / "trainer.pt", m)),
    "old-format rng-rank0.pt": lambda c, m: (_as_format_1(c), _torch_pickle(
        c / "rng-rank0.pt", m, wrap=lambda p: {"torch": torch.get_rng_state(), "numpy": p})),
    "tokenizer.json of the checkpoint as a pickle": lambda c, m: _plain_pickle(c / "model" / "tokenizer.json", m),
    "config.yaml of the checkpoint with a python tag": lambda c, m: _yaml_payload(c / "config.yaml", m),
}


@pytest.mark.parametrize("case", list(RESUME_PLANTS))
def test_resume_never_unpickles(built, tmp_path, capsys, case):
    args, marker = _resume_case(built, tmp_path, RESUME_PLANTS[case])
    rc, err = _cli(args, capsys)
    assert not marker.exists(), f"the payload ran: {marker} was created"
    assert "Traceback" not in err
    # a planted file either stops the run with one clear line or is not read at all (the
    # checkpoint's own tokenizer and config.yaml are not inputs of a resume: the run's are)
    if rc != 0:
        assert rc == 1 and sum(line.startswith("bertkit pretrain: error:") for line in err.splitlines()) == 1, err


@pytest.mark.parametrize("case", ["trainer.safetensors as a pickle", "rng-rank0.safetensors as a pickle",
                                  "trainer.json as a pickle", "old-format trainer.pt", "old-format rng-rank0.pt"])
def test_resume_refuses_tampered_state_with_one_line(built, tmp_path, capsys, case):
    args, marker = _resume_case(built, tmp_path, RESUME_PLANTS[case])
    line = _assert_refused(args, capsys, marker, "pretrain")
    assert "step-00000002" in line


# ---- model and tokenizer folders ------------------------------------------------------------------
def _model_copy(built, tmp_path) -> Path:
    model = tmp_path / "model"
    shutil.copytree(built["run"] / "final", model)
    return model


MODEL_PLANTS = {
    "pytorch_model.bin": lambda d, m: ((d / "model.safetensors").unlink(), _torch_pickle(d / "pytorch_model.bin", m)),
    "pytorch_model.bin (plain pickle)": lambda d, m: ((d / "model.safetensors").unlink(),
                                                      _plain_pickle(d / "pytorch_model.bin", m)),
    "model.safetensors": lambda d, m: _torch_pickle(d / "model.safetensors", m),
    "model.safetensors.index.json": lambda d, m: ((d / "model.safetensors").unlink(),
                                                  _plain_pickle(d / "model.safetensors.index.json", m)),
    "config.json": lambda d, m: _plain_pickle(d / "config.json", m),
}


@pytest.mark.parametrize("command", ["info", "embed", "fill-mask"])
@pytest.mark.parametrize("case", list(MODEL_PLANTS))
def test_model_files_never_unpickle(built, tmp_path, capsys, case, command):
    model = _model_copy(built, tmp_path)
    marker = tmp_path / "marker"
    MODEL_PLANTS[case](model, marker)
    texts = tmp_path / "texts.txt"
    texts.write_text("a line of text\n")
    args = {"info": ["info", model], "embed": ["embed", texts, "--model", model],
            "fill-mask": ["fill-mask", "the [MASK] of it", "--model", model]}[command]
    _assert_refused(args, capsys, marker, command)


@pytest.mark.parametrize("name", ["tokenizer.json", "vocab.txt", "tokenizer_config.json"])
def test_tokenizer_files_never_unpickle(built, tmp_path, capsys, name):
    tok = tmp_path / "tok"
    shutil.copytree(built["run"] / "final", tok)
    if name == "tokenizer.json":
        (tok / "vocab.txt").unlink()             # so tokenizer.json is the vocabulary read
    marker = tmp_path / "marker"
    _plain_pickle(tok / name, marker)
    texts = tmp_path / "texts.txt"
    texts.write_text("a line of text\n")
    _assert_refused(["tokenize", texts, "--model", tok], capsys, marker, "tokenize")


# ---- prepared data and configs --------------------------------------------------------------------
@pytest.mark.parametrize("name", ["input_ids.npy", "offsets.npy", "meta.json", "shard.json"])
@pytest.mark.parametrize("command", ["data", "pretrain"])
def test_prepared_data_never_unpickles(built, tmp_path, capsys, name, command):
    data = tmp_path / "data"
    shutil.copytree(built["data"], data)
    marker = tmp_path / "marker"
    target = data / name if name == "meta.json" else next(data.glob("shard-*")) / name
    (_npy_pickle if name.endswith(".npy") else _plain_pickle)(target, marker)
    args = ["data", "stats", data] if command == "data" else \
        ["pretrain", built["config"], f"--out={tmp_path / 'run'}", f"--data.path={data}"]
    _assert_refused(args, capsys, marker, command)


def test_yaml_configs_never_construct_objects(built, tmp_path, capsys):
    marker = tmp_path / "marker"
    _yaml_payload(tmp_path / "evil.yaml", marker)
    _assert_refused(["pretrain", tmp_path / "evil.yaml"], capsys, marker, "pretrain")
    _assert_refused(["finetune", tmp_path / "evil.yaml"], capsys, marker, "finetune")


def test_the_payloads_run_code_when_unpickled(tmp_path):
    """The check above is only worth something if the planted files are real attacks."""
    import yaml

    cases = [(_torch_pickle, lambda p: torch.load(p, weights_only=False)),
             (_plain_pickle, lambda p: pickle.loads(p.read_bytes())),
             (_npy_pickle, lambda p: np.load(p, allow_pickle=True)),
             (_yaml_payload, lambda p: yaml.unsafe_load(p.read_text()))]
    for i, (plant, unsafe_load) in enumerate(cases):
        marker, path = tmp_path / f"marker{i}", tmp_path / f"file{i}.npy"
        plant(path, marker)
        unsafe_load(path)
        assert marker.exists(), plant.__name__


def test_no_unsafe_loader_in_the_package():
    """A guard for code still to come: every torch.load passes weights_only=True, every np.load
    allow_pickle=False; pickle, dill, marshal, joblib, yaml.load / unsafe_load / full_load,
    pandas.read_pickle and torch.jit.load are not called at all."""
    import ast

    import bertkit

    forbidden = {("pickle", "load"), ("pickle", "loads"), ("pickle", "Unpickler"), ("dill", "load"),
                 ("dill", "loads"), ("marshal", "load"), ("marshal", "loads"), ("joblib", "load"),
                 ("yaml", "load"), ("yaml", "unsafe_load"), ("yaml", "full_load"), ("pd", "read_pickle"),
                 ("pandas", "read_pickle"), ("jit", "load"), ("shelve", "open")}
    problems = []
    root = Path(bertkit.__file__).parent
    for f in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value
            owner_name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            call = (owner_name, node.func.attr)
            kw = {k.arg: k.value for k in node.keywords}
            where = f"{f.relative_to(root)}:{node.lineno}"
            if call in forbidden:
                problems.append(f"{where}: {owner_name}.{node.func.attr}")
            elif call == ("torch", "load") and not (isinstance(kw.get("weights_only"), ast.Constant)
                                                    and kw["weights_only"].value is True):
                problems.append(f"{where}: torch.load without weights_only=True")
            elif call in (("np", "load"), ("numpy", "load")) and not (
                    isinstance(kw.get("allow_pickle"), ast.Constant) and kw["allow_pickle"].value is False):
                problems.append(f"{where}: np.load without allow_pickle=False")
    assert not problems, problems
