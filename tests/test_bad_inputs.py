"""A corpus of malformed inputs (tests/data/bad_inputs/*.jsonl) for the commands `info`, `tokenize`,
`embed`, `fill-mask`, `score`, `pretrain` (config values) and the `bertkit` entry point itself.

Each case runs in-process through `bertkit.cli.main` under a time limit and must end with a
exit status 1 (or the exit code the case documents), exactly one `bertkit CMD: error:` line that
matches the case's `match`, no traceback, no hang, and nothing new left in its folder. A case is
one JSON line:

    {"id": "...", "args": ["embed", "{tmp}/in.txt", "--model", "{model}"],
     "files": {"in.txt": "text"},                 written into the case's folder {tmp} first
     "model": {"config": {"hidden_size": "768"},  a copy of the base model as {m}, config.json
               "tokenizer": {"model.vocab.[PAD]": -1},   keys set / deleted (null + "delete": [...]),
               "files": {"vocab.txt": "..."}, "delete": ["vocab.txt"]},   tokenizer.json by dotted path
     "stdin": "...", "match": "regex the error line must match",
     "exit": 0, "out_match": "regex"}             a documented success, and what its output must say

Strings starting with "b64:" are written as the bytes they encode. `python tests/test_bad_inputs.py`
prints the counts per outcome (clean error, traceback, hang, silent success, wrong result, output
left behind) instead of failing on the first.
"""
from __future__ import annotations

import base64
import io
import json
import re
import shutil
import signal
import sys
from pathlib import Path

import pytest

CASES_DIR = Path(__file__).parent / "data" / "bad_inputs"
TIME_LIMIT_S = 60


def load_cases() -> list[dict]:
    cases = []
    for f in sorted(CASES_DIR.glob("*.jsonl")):
        for lineno, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip() and not line.lstrip().startswith("//"):
                case = json.loads(line)
                case["where"] = f"{f.name}:{lineno}"
                cases.append(case)
    ids = [c["id"] for c in cases]
    dupes = {i for i in ids if ids.count(i) > 1}
    assert not dupes, f"duplicate case ids: {sorted(dupes)}"
    return cases


def test_the_corpus_is_what_its_generator_writes():
    """generate.py saves typing the cases; a case edited in one place only would be lost or revived the
    next time someone runs it. (A file it does not write, such as inspect.jsonl, is kept by hand.)"""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bad_inputs_generate", CASES_DIR / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    written = {f.stem: [json.loads(line) for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
               for f in CASES_DIR.glob("*.jsonl")}
    generated = gen.groups()
    assert set(generated) <= set(written)
    for name, cases in generated.items():
        differ = [c["id"] for c, w in zip(cases, written[name]) if c != w]
        assert len(cases) == len(written[name]) and not differ, f"{name}.jsonl differs from generate.py: {differ[:5]}"


# ---- the models and files the cases start from ---------------------------------------------------
def build_fixtures(root: Path) -> dict[str, str]:
    """A tiny masked-LM checkpoint ({model}, 64 positions), an encoder-only one ({encoder}), a
    tokenizer folder ({tok}), a text file ({texts}), an SST-2 folder of 16 + 8 sentences ({sst}), the
    masked-LM checkpoint fine-tuned on it for 2 updates ({cls}) and pre-training data of 64 tokens ({prep})."""
    import gzip
    from importlib import resources

    import torch

    from bertkit.checkpoint import build, save_model
    from bertkit.config import BertConfig
    from bertkit.tokenizer import Tokenizer

    root.mkdir(parents=True, exist_ok=True)
    corpus = root / "corpus.txt"
    corpus.write_bytes(gzip.decompress((resources.files("bertkit") / "sample" / "inaugural.txt.gz").read_bytes()))
    tok = Tokenizer.train([corpus], vocab_size=400)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                     max_position_embeddings=64)
    for name, head in (("model", "masked_lm"), ("encoder", "encoder")):
        save_model(build(head, cfg), root / name)
        tok.save(root / name)
    tok.save(root / "tok")
    (root / "texts.txt").write_text("the people of the united states\nwe hold these truths\n", encoding="utf-8")
    (root / "sst").mkdir()
    for split, n in (("train", 16), ("dev", 8)):
        rows = [f"{'a good' if i % 2 else 'a bad'} speech of the people\t{i % 2}" for i in range(n)]
        (root / "sst" / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    from bertkit.finetune import FinetuneConfig, finetune
    finetune(FinetuneConfig(task="sst2", data=str(root / "sst"), model=str(root / "model"), out=str(root / "cls"),
                            epochs=1, batch_size=8, progress=False, threads=1))
    from bertkit.data.prepare import PrepareConfig, prepare
    prepare([str(corpus)], tok, root / "prep", PrepareConfig(max_length=64), progress=False)
    return {"model": str(root / "model"), "encoder": str(root / "encoder"), "tok": str(root / "tok"),
            "texts": str(root / "texts.txt"), "sst": str(root / "sst"), "cls": str(root / "cls"),
            "prep": str(root / "prep")}


def _content(value) -> bytes:
    if isinstance(value, str) and value.startswith("b64:"):
        return base64.b64decode(value[4:])
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return (json.dumps(value) + "\n").encode("utf-8")           # a JSON value, written as JSON


def _set_path(obj: dict, dotted: str, value, delete: bool = False) -> None:
    """obj['a']['b'] = value for 'a.b'; a key with dots in it ('[PAD]' has none) is not supported."""
    *parents, last = dotted.split(".")
    for p in parents:
        obj = obj[p]
    if delete:
        obj.pop(last, None)
    else:
        obj[last] = value


def materialize(case: dict, fixtures: dict[str, str], tmp: Path) -> dict[str, str]:
    """Write the case's files (and model copy) under `tmp`; the placeholders for its arguments."""
    names = {**fixtures, "tmp": str(tmp)}
    for rel, value in (case.get("files") or {}).items():
        p = tmp / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(_content(value))
    spec = case.get("model")
    if spec is not None:
        m = tmp / "m"
        shutil.copytree(fixtures[spec.get("base", "model")], m)
        if "config" in spec or "config_delete" in spec:
            cfg = json.loads((m / "config.json").read_text())
            for k, v in (spec.get("config") or {}).items():
                cfg[k] = v
            for k in spec.get("config_delete", []):
                cfg.pop(k, None)
            (m / "config.json").write_text(json.dumps(cfg))
        if "tokenizer" in spec:
            tj = json.loads((m / "tokenizer.json").read_text())
            for k, v in spec["tokenizer"].items():
                _set_path(tj, k, v, delete=v == "__delete__")
            (m / "tokenizer.json").write_text(json.dumps(tj))
        for rel in spec.get("delete", []):
            (m / rel).unlink()
        for rel, value in (spec.get("files") or {}).items():
            (m / rel).write_bytes(_content(value))
        names["m"] = str(m)
    return names


class _Hang(BaseException):
    """Raised by the alarm: a case ran past its time limit."""


def _alarm(signum, frame):
    raise _Hang()


def _snapshot(root: Path) -> dict[str, tuple]:
    return {str(p.relative_to(root)): (p.is_dir(), p.stat().st_size if p.is_file() else 0, p.stat().st_mtime_ns)
            for p in root.rglob("*")}


def run_case(case: dict, fixtures: dict[str, str], tmp: Path, capture) -> dict:
    """Run one case; returns {'outcome': ..., 'rc', 'err', 'detail'}."""
    from bertkit.cli import main

    tmp.mkdir(parents=True, exist_ok=True)
    names = materialize(case, fixtures, tmp)
    args = [a.format(**names) for a in case["args"]]
    before = _snapshot(tmp)
    stdin = sys.stdin
    if "stdin" in case:
        sys.stdin = io.TextIOWrapper(io.BytesIO(_content(case["stdin"])), encoding="utf-8")
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(case.get("timeout", TIME_LIMIT_S))
    rc, escaped = None, None
    try:
        rc = main(args)
    except SystemExit as e:                               # argparse: one error line, exit 1 (bertkit.cli.Parser)
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except _Hang:
        escaped = "hang"
    except BaseException as e:                            # noqa: BLE001 - a traceback is what we count
        escaped = f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        sys.stdin = stdin
    out, err = capture()
    after = _snapshot(tmp)
    left = sorted(k for k in after if k not in before or (not after[k][0] and after[k] != before[k]))
    result = {"rc": rc, "err": err[-3000:], "left": left, "args": args}
    expected = case.get("exit", "error")
    error_lines = [line for line in err.splitlines() if re.match(r"bertkit( [\w-]+)?: error: ", line)]
    if escaped == "hang":
        return {**result, "outcome": "hang"}
    if escaped is not None or "Traceback (most recent call last)" in err:
        return {**result, "outcome": "traceback", "detail": escaped or err[-500:]}
    if expected == "error":
        if rc == 0:
            return {**result, "outcome": "silent success"}
        if len(error_lines) != 1 or rc != 1:
            return {**result, "outcome": "wrong result", "detail": f"rc {rc}, {len(error_lines)} error lines"}
        if case.get("match") and not re.search(case["match"], error_lines[0]):
            return {**result, "outcome": "wrong result", "detail": f"error does not match {case['match']!r}: "
                                                                   f"{error_lines[0][:300]}"}
    elif rc != expected:
        return {**result, "outcome": "wrong result", "detail": f"exit {rc}, documented {expected}"}
    elif case.get("out_match") and not re.search(case["out_match"], out):
        return {**result, "outcome": "wrong result", "detail": f"output does not match {case['out_match']!r}: "
                                                               f"{out[-300:]}"}
    if left:
        return {**result, "outcome": "output left behind", "detail": ", ".join(left[:5])}
    return {**result, "outcome": "clean"}


# ---- pytest ----------------------------------------------------------------------------------------
CASES = load_cases()


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> dict[str, str]:
    return build_fixtures(tmp_path_factory.mktemp("bad_inputs_base"))


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_bad_input_is_one_clear_error(case, fixtures, tmp_path, capsys):
    def capture():
        captured = capsys.readouterr()
        return captured.out, captured.err

    r = run_case(case, fixtures, tmp_path / "case", capture)
    assert r["outcome"] == "clean", (f"{case['where']} {case['id']}: {r['outcome']} "
                                     f"{r.get('detail', '')}\nargs: {r['args']}\nstderr: {r['err'][-1500:]}")


def test_a_usage_mistake_is_one_line_and_exit_status_1_as_the_readme_says():
    import subprocess

    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    assert "an unknown or mistyped option" in readme and "exit status 1" in readme
    r = subprocess.run([sys.executable, "-m", "bertkit", "finetune", "--batchsize", "3"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.splitlines() == ["bertkit finetune: error: unrecognized arguments: --batchsize "
                                     "(did you mean --batch_size?)"]


def test_the_memory_check_counts_the_parameters_without_allocating_them():
    from bertkit.checkpoint import build
    from bertkit.config import preset
    from bertkit.model import num_parameters
    from bertkit.train.model import parameter_count

    for kw in ({}, {"num_layers": 3, "norm_position": "pre", "position_embedding_type": "alibi"}, {"num_layers": 1}):
        cfg = preset("tiny", vocab_size=500, **kw)
        for nsp in (True, False):
            assert parameter_count(cfg, {"nsp": nsp}) == num_parameters(build("pretraining", cfg, nsp=nsp)), (kw, nsp)


def test_the_corpus_is_broad():
    commands = {c["args"][0] if c["args"] else "" for c in CASES}
    assert len(CASES) >= 300 and {"info", "tokenize", "embed", "fill-mask", "score", "pretrain"} <= commands


if __name__ == "__main__":          # counts per outcome: python tests/test_bad_inputs.py [ID-REGEX]
    import collections
    import contextlib
    import logging
    import tempfile

    logging.disable(logging.WARNING)
    pattern = re.compile(sys.argv[1]) if len(sys.argv) > 1 else None
    with tempfile.TemporaryDirectory() as d:
        fx = build_fixtures(Path(d) / "base")
        counts: collections.Counter = collections.Counter()
        for i, case in enumerate(c for c in CASES if pattern is None or pattern.search(c["id"])):
            buf_out, buf_err = io.StringIO(), io.StringIO()

            def capture():
                return buf_out.getvalue(), buf_err.getvalue()

            with contextlib.redirect_stdout(buf_out), contextlib.redirect_stderr(buf_err):
                r = run_case(case, fx, Path(d) / f"c{i}", capture)
            counts[r["outcome"]] += 1
            if r["outcome"] != "clean":
                print(f"{r['outcome']:18s} {case['id']}: {r.get('detail', '')[:200]}".replace("\n", " | "))
        print(dict(counts), "tried", sum(counts.values()))
