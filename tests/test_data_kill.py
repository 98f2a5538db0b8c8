"""`bertkit prepare` killed with -9: never complete-looking and inconsistent, never orphan workers."""
from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bertkit.cli import main
from bertkit.data.prepare import PrepareConfig, prepare
from bertkit.data.pretraining import DataError, open_dataset
from bertkit.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "src" / "bertkit" / "sample" / "inaugural.txt.gz"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """24 inaugural addresses: ~25 chunks of 15 kB."""
    d = tmp_path_factory.mktemp("kill_corpus")
    docs = gzip.open(SAMPLE, "rt", encoding="utf-8").read().split("\n\n")[:24]
    (d / "c.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return d / "c.txt"


def _prepare_cmd(minilm: Path, corpus: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "bertkit", "prepare", "--model", str(minilm), "--input", str(corpus),
            "--out", str(out), "--max-length", "64", "--chunk-mb", "0.015", "--no-progress", *extra]


# `bertkit prepare ARGS` that SIGKILLs itself right after its N-th new shard (no cleanup runs), through
# prepare()'s on_shard: argv is N, then the command line after `python -m bertkit`.
_KILLED_AFTER = """
import functools, os, signal, sys
import bertkit.data.prepare as P
from bertkit.cli import main

n = int(sys.argv[1])
P.prepare = functools.partial(P.prepare, on_shard=lambda k: os.kill(os.getpid(), signal.SIGKILL) if k == n else None)
sys.exit(main(sys.argv[2:]))
"""


def _killed_after(shards: int, cmd: list[str]) -> list[str]:
    """`cmd` (a `python -m bertkit prepare ...` command) killed after its `shards`-th new shard."""
    assert cmd[1:3] == ["-m", "bertkit"], cmd
    return [cmd[0], "-c", _KILLED_AFTER, str(shards), *cmd[3:]]


def _run(cmd: list[str], kill_after: int | None = None, **kw) -> subprocess.Popen | subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if kill_after is not None:
        cmd = _killed_after(kill_after, cmd)
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, **kw)


def _npy(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*.npy"))}


def test_killed_rerun_is_visibly_incomplete_then_finishes(minilm, corpus, tmp_path, capsys):
    out = tmp_path / "data"
    old = prepare([str(corpus)], Tokenizer.from_dir(minilm), out,
                  PrepareConfig(max_length=64, chunk_mb=0.015, seed=1), progress=False)
    assert len(old["shards"]) >= 6
    # a rerun with other options rewrites every shard; kill -9 after its 3rd new shard
    proc = _run(_prepare_cmd(minilm, corpus, out, "--seed", "2"), kill_after=3)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert not (out / "meta.json").exists()               # the old meta never describes the new shards
    with pytest.raises(DataError, match="not complete.*rerun the same prepare command"):
        open_dataset(out)
    assert main(["data", "stats", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("bertkit data: error:") and "not complete" in err and "Traceback" not in err
    assert main(["pretrain", f"--out={tmp_path / 'run'}", f"--data.path={out}", "--train.max_steps=1",
                 "--train.progress=false"]) == 1
    assert "not complete" in capsys.readouterr().err
    # the same command again finishes the job: identical to a run that was never interrupted
    proc = _run(_prepare_cmd(minilm, corpus, out, "--seed", "2"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    straight = prepare([str(corpus)], Tokenizer.from_dir(minilm), tmp_path / "straight",
                       PrepareConfig(max_length=64, chunk_mb=0.015, seed=2), progress=False)
    ds = open_dataset(out)
    assert ds.meta["seed"] == 2 and ds.meta["shards"] == straight["shards"]
    assert 3 <= ds.meta["counts"]["shards_kept_from_before"] < len(straight["shards"])
    assert _npy(out) == _npy(tmp_path / "straight")
    assert main(["data", "stats", str(out), "--json"]) == 0


def test_leftovers_of_a_killed_first_run_do_not_block(minilm, corpus, tmp_path):
    """A run killed while writing its vocabulary (old versions left an empty vocab.txt)."""
    out = tmp_path / "data"
    (out / "tokenizer").mkdir(parents=True)
    (out / "tokenizer" / "vocab.txt").write_text("")
    (out / ".tokenizer.tmp-12345").mkdir()
    meta = prepare([str(corpus)], Tokenizer.from_dir(minilm), out, PrepareConfig(max_length=64, chunk_mb=0.05),
                   progress=False)
    assert open_dataset(out).tokenizer().fingerprint() == meta["tokenizer_hash"]
    assert not list(out.glob(".tokenizer*"))
    # a failed run into a new folder leaves no folder behind
    (tmp_path / "one.txt").write_text("Only one document.\nTwo lines.\n")
    with pytest.raises(Exception, match="at least 2 documents"):
        prepare([str(tmp_path / "one.txt")], Tokenizer.from_dir(minilm), tmp_path / "new", PrepareConfig(),
                progress=False)
    assert not (tmp_path / "new").exists()


def _group(pgid: int) -> list[int]:
    """Live processes (not zombies) of a process group."""
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                fields = (Path("/proc") / d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(d))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killed_parallel_prepare_leaves_no_workers(minilm, corpus, tmp_path):
    proc = subprocess.Popen(_killed_after(2, _prepare_cmd(minilm, corpus, tmp_path / "data", "--workers", "2")),
                            cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, err[-2000:]
    deadline = time.time() + 10
    while _group(proc.pid) and time.time() < deadline:
        time.sleep(0.1)
    assert _group(proc.pid) == [], "prepare workers outlived their parent"
