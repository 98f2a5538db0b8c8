"""The modules of bertkit import each other in one direction: no import cycles.

The first graph holds the imports that run when a module is loaded (module level, including
`try:` / `if` blocks and class bodies there); the others add the imports under
`if TYPE_CHECKING:` (annotations are a dependency too) and those inside functions (which only hide
a cycle). Each is held at 0 circles; `circles()` lists them all.
"""
from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import bertkit

SRC = Path(bertkit.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module under src/bertkit (a package is its __init__.py)."""
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _runtime_statements(body, call_time: bool = False, typing: bool = False):
    """The statements of a module body that run on import: not function bodies (unless `call_time`),
    not TYPE_CHECKING (unless `typing`)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not call_time:
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) and not typing:
            yield from _runtime_statements(node.orelse, call_time, typing)
            continue
        yield node
        for name in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(node, name, None)
            if isinstance(inner, list):
                yield from _runtime_statements(inner, call_time, typing)


def import_graph(modules: dict[str, Path], call_time: bool = False, typing: bool = False) -> dict[str, set[str]]:
    """module -> the bertkit modules it imports at module level (and inside functions: `call_time`;
    under `if TYPE_CHECKING:`: `typing`)."""
    graph = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        edges = set()
        for node in _runtime_statements(ast.parse(path.read_text(encoding="utf-8")).body, call_time, typing):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:            # `from . import x`, `from .data import text`: submodules
                    if f"{target}.{alias.name}" in modules:
                        edges.add(f"{target}.{alias.name}")
                    elif target in modules:          # a name defined in the module (or package) itself
                        edges.add(target)
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None (depth-first search, three colours)."""
    state: dict[str, int] = {}                  # absent: unseen, 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle: the strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_circles_are_counted():
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c", "a"}}) == [["a", "b"], ["c", "d"]]


def test_no_circles_even_through_type_checking_imports():
    """Annotations only are still a dependency a reader follows: train.Run used by runlog and
    runstate under TYPE_CHECKING was the last circle (Run and Step now live in runstate)."""
    graph = import_graph(_modules(), typing=True)
    assert "bertkit.runstate" in graph["bertkit.runlog"]
    assert circles(graph) == []


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]
    assert find_cycle({"x": {"y"}, "y": {"x"}}) == ["x", "y", "x"]


def test_graph_reads_relative_imports(tmp_path):
    """The parser resolves `from . import`, `from .x import`, `from ..x import` and `import bertkit.x`."""
    pkg = tmp_path / "bertkit"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "bertkit/__init__.py": "",
        "bertkit/a.py": "from . import b\nfrom .sub import c\n",
        "bertkit/b.py": "import bertkit.sub\ndef f():\n    from . import a\n",
        "bertkit/sub/__init__.py": "",
        "bertkit/sub/c.py": "try:\n    from ..a import thing\nexcept ImportError:\n    pass\n",
        "bertkit/sub/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import x\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).write_text(text)
    modules = {"bertkit": pkg / "__init__.py", "bertkit.a": pkg / "a.py", "bertkit.b": pkg / "b.py",
               "bertkit.sub": pkg / "sub" / "__init__.py", "bertkit.sub.c": pkg / "sub" / "c.py",
               "bertkit.sub.d": pkg / "sub" / "d.py"}
    graph = import_graph(modules)
    assert graph == {"bertkit": set(), "bertkit.a": {"bertkit.b", "bertkit.sub.c"}, "bertkit.b": {"bertkit.sub"},
                     "bertkit.sub": set(), "bertkit.sub.c": {"bertkit.a"}, "bertkit.sub.d": set()}
    assert find_cycle(graph) == ["bertkit.a", "bertkit.sub.c", "bertkit.a"]


def test_no_import_cycles():
    modules = _modules()
    assert {"bertkit.model", "bertkit.train", "bertkit.data.encode", "bertkit.tasks.squad",
            "bertkit.commands.finetune"} <= set(modules)
    graph = import_graph(modules)
    assert "bertkit.runstate" in graph["bertkit.train"]          # the graph is not empty by accident
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_packing_stands_below_the_model():
    """model.py uses packing.py; packing.py knows nothing of the model; infer/prepack.py sits on top."""
    graph = import_graph(_modules())
    assert "bertkit.packing" in graph["bertkit.model"]
    assert not graph["bertkit.packing"] & {"bertkit.model", "bertkit.infer.prepack"}
    assert "bertkit.infer.prepack" not in graph["bertkit.model"]
    graph["bertkit.packing"] = graph["bertkit.packing"] | {"bertkit.model"}     # what the split forbids
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1] and set(cycle) == {"bertkit.model", "bertkit.packing"}


def test_fast_is_gone():
    assert not (SRC / "fast.py").exists()
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("bertkit.fast")


def test_one_data_error_class():
    """Task data and prepared pre-training data raise the same DataError (it was two classes)."""
    from bertkit.data.pretraining import DataError as PretrainingDataError
    from bertkit.errors import BertkitError, DataError
    from bertkit.tasks import DataError as TaskDataError

    assert PretrainingDataError is DataError and TaskDataError is DataError
    assert issubclass(DataError, BertkitError) and issubclass(DataError, ValueError)


@pytest.mark.parametrize("command", ["ablate", "quickstart", "pretrain", "prepare", "tokenizer", "tokenize", "info"])
def test_the_help_of_a_light_command_loads_no_torch(command):
    """`bertkit COMMAND --help` for these commands starts in a fifth of a second: torch (two seconds to
    import) stays inside the functions that run the job (docs/layout.md; moving ablate's imports to the
    top once made `ablate --help` 2.2 s and `quickstart --help` 3.4 s)."""
    code = ("import contextlib, io, sys\nfrom bertkit.cli import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()):\n    try: main([{command!r}, '--help'])\n"
            "    except SystemExit: pass\nprint(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "torch" not in out.stdout.strip().splitlines()[-1], f"bertkit {command} --help imports torch"


def test_a_library_error_is_one_line_even_when_it_says_nothing():
    """`errors.first_line` quotes what a library raised in bertkit's one-line errors: the first line of
    its message, cut; the exception's type where the message is empty (ten of the fifteen places it
    replaced indexed the first line of an empty message: IndexError from inside the error path)."""
    from bertkit.errors import first_line

    assert first_line(OSError("\n  disk gone\nat block 7  ")) == "disk gone"
    assert first_line(ValueError("x" * 500), 150) == "x" * 150
    assert first_line(RuntimeError()) == first_line(RuntimeError("  \n ")) == "RuntimeError"


def test_no_cycles_even_through_imports_at_call_time():
    """A call-time import only hides a cycle; between modules there are none (train <-> runstate,
    text <-> sources, serve <-> serve_compat and ablate <-> ablate_report were). Inside the tasks
    package the table of tasks and the task modules know each other (a registry), so that package
    is one node here."""
    graph = import_graph(_modules(), call_time=True)
    one = lambda m: "bertkit.tasks" if m.startswith("bertkit.tasks") else m
    merged: dict[str, set[str]] = {}
    for a, targets in graph.items():
        merged.setdefault(one(a), set()).update(one(b) for b in targets if one(b) != one(a))
    assert "bertkit.ablate" in merged["bertkit.commands.ablate"]          # a call-time edge is in
    cycle = find_cycle(merged)
    assert cycle is None, "import cycle (counting imports inside functions): " + " -> ".join(cycle)


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_prediction_and_serving_never_import_fine_tuning():
    """Running a checkpoint (predict.py, infer/, serve/) imports no training module,
    directly or through another, counting imports inside functions and under TYPE_CHECKING: what
    prediction shares with fine-tuning about a task (which task, strides, features, reference checks,
    scores, the predictions file) is tasks/plumbing.py; the tasks package sits below both and
    imports neither, nor the model."""
    modules = _modules()
    graph = import_graph(modules, call_time=True, typing=True)
    top = lambda m: m.split(".")[1] if "." in m else ""          # bertkit.ablate.config -> ablate
    running = [m for m in modules if top(m).startswith(("predict", "infer", "serve", "onnx"))]
    assert {"bertkit.predict", "bertkit.infer", "bertkit.serve", "bertkit.serve.api", "bertkit.infer.export"} <= set(running)
    training = {m for m in modules if top(m).startswith(("finetune", "train", "ablate"))}
    assert {"bertkit.finetune", "bertkit.train"} <= training
    assert "bertkit.tasks.plumbing" in graph["bertkit.predict"]           # the graph is not empty by accident
    for module in running:
        assert not _reach(graph, module) & training, f"{module} imports {sorted(_reach(graph, module) & training)}"
    above_tasks = training | set(running) | {"bertkit.model", "bertkit.checkpoint", "bertkit.packing"}
    for module in (m for m in modules if top(m) == "tasks"):        # the floor below both: no import runs back up
        assert not _reach(graph, module) & above_tasks, f"{module} imports {sorted(_reach(graph, module) & above_tasks)}"
