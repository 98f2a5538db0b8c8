"""Output folders that are either complete or visibly incomplete, whatever kills the writer.

    with staged_dir("runs/sst2", owned=is_finetune_output) as tmp:    # tmp = runs/sst2.incomplete
        ... write every file into tmp ...
    # on success tmp replaces runs/sst2 in one step; the previous run there is deleted after

While the command runs, `OUT` is untouched (the previous run, or nothing) and the new files sit
in the sibling `OUT.incomplete`. On success the two are swapped atomically (Linux renameat2
RENAME_EXCHANGE; elsewhere two renames a few microseconds apart), so `kill -9` at any point leaves
`OUT` either the old complete run or the new complete one, never old metrics beside new weights.
A checkpoint written into the staging folder carries `bertkit_incomplete` in its config.json,
which `checkpoint.read_config` (every reader: load_model, evaluate, predict, serve) refuses, so a
killed run's best-so-far checkpoint cannot be mistaken for a finished one; the writer removes
the key last, just before the swap. The next run into the same `OUT` removes a stale
`OUT.incomplete` (unless the process that wrote it is still alive). On an error the staging
folder is removed, or kept (still marked) when it holds a checkpoint worth looking at.
`write_folder` does the same for a folder a run writes inside its own output (pre-training's
`final/`, the model of each checkpoint).
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Callable, Iterator

from .errors import BertkitError

log = logging.getLogger("bertkit")

INCOMPLETE_KEY = "bertkit_incomplete"
_WRITER = ".bertkit-writer"          # pid of the process writing a staging folder


def staging_path(out: Path) -> Path:
    return out.with_name(out.name + ".incomplete")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _writer_pid(tmp: Path) -> int | None:
    try:
        return int((tmp / _WRITER).read_text().strip())
    except (OSError, ValueError):
        return None


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one step (Linux renameat2 RENAME_EXCHANGE); False where the
    system or file system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(str(a)), at_fdcwd, os.fsencode(str(b)), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EPERM, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a))


def _remove(path: Path) -> None:
    """Delete a folder; its config.json first, so a half-deleted folder is not a loadable checkpoint."""
    (path / "config.json").unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)


def fsync_path(path: Path) -> None:
    """fsync one file or folder (where the file system allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and folder under `root`, and `root` last."""
    for p in [*root.rglob("*"), root]:
        fsync_path(p)


def write_whole(path: Path, text: str) -> None:
    """`text` as the file `path`, whole or not at all: written under a temporary name of this process
    beside it, then renamed over it (a reader never sees half a file; two writers: the last wins)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def mark_incomplete(config: dict, why: str) -> dict:
    """config.json keys for a checkpoint saved into a staging folder."""
    return {**config, INCOMPLETE_KEY: why}


def clear_incomplete(folder: Path) -> None:
    """Remove the incomplete mark from folder/config.json (atomically), if there is one."""
    cj = folder / "config.json"
    if not cj.is_file():
        return
    raw = json.loads(cj.read_text(encoding="utf-8"))
    if INCOMPLETE_KEY not in raw:
        return
    raw.pop(INCOMPLETE_KEY)
    tmp = cj.with_name("config.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(raw, indent=2, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(cj)


def _check_out(out: Path, owned: Callable[[Path], bool], what: str) -> None:
    cwd = Path.cwd()
    if out == cwd or out in cwd.parents:
        raise BertkitError(f"--out {out}: is the current folder (or holds it); give a folder of its own")
    if out.exists() and not out.is_dir():
        raise BertkitError(f"--out {out}: is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not owned(out):
        names = sorted(p.name for p in out.iterdir())[:3]
        raise BertkitError(f"--out {out}: the folder holds other files ({', '.join(names)}, ...), not a previous "
                           f"{what}; choose a new folder or empty it")


@contextlib.contextmanager
def staged_dir(out: str | Path, owned: Callable[[Path], bool], what: str = "run") -> Iterator[Path]:
    """Yield the staging folder `OUT.incomplete`; on success it replaces `OUT` (module doc).

    `owned(OUT)` says whether an existing, non-empty `OUT` is a previous run of this kind (which
    the new one may replace); anything else is an error rather than deleted."""
    out = Path(os.path.abspath(out))               # "runs/x/", "." and ".." name real folders
    _check_out(out, owned, what)
    tmp = staging_path(out)
    if tmp.exists():
        pid = _writer_pid(tmp)
        if pid is not None and pid != os.getpid() and _alive(pid):
            raise BertkitError(f"--out {out}: another process (pid {pid}) is writing {tmp}; wait for it or stop it")
        log.info("removing %s, left by an interrupted run", tmp)
        _remove(tmp)
    created = [p for p in (out.parent, *out.parent.parents) if not p.exists()]
    tmp.mkdir(parents=True)
    (tmp / _WRITER).write_text(f"{os.getpid()}\n")
    try:
        yield tmp
    except BaseException:
        if next(tmp.rglob("config.json"), None) is not None:      # a checkpoint worth a look
            log.warning("the unfinished run is in %s (its checkpoint is marked incomplete)", tmp)
        else:
            _remove(tmp)
            for p in created:                       # parents made for this run, still empty
                with contextlib.suppress(OSError):
                    p.rmdir()
        raise
    (tmp / _WRITER).unlink(missing_ok=True)
    swap_in(tmp, out)


def swap_in(tmp: Path, out: Path) -> None:
    """Make the complete folder `tmp` be `out` in one step, the previous `out` (if any) deleted
    after: its files are fsynced and its incomplete mark (if any) removed first."""
    fsync_tree(tmp)
    clear_incomplete(tmp)                           # from here to the swap (microseconds) tmp is complete
    if not out.exists():
        os.rename(tmp, out)
    elif _exchange(tmp, out):
        _remove(tmp)                                # now the previous one
    else:                                           # two renames: a kill in between leaves both
        old = out.with_name(out.name + ".replaced")
        _remove(old)
        os.rename(out, old)
        os.rename(tmp, out)
        _remove(old)


def write_folder(out: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` into `OUT.incomplete` (a stale one removed first), then `swap_in`: whatever
    kills the writer, `out` is the previous complete folder or the new complete one. A checkpoint
    written into `tmp` should carry the incomplete mark (`mark_incomplete`), so that the staging
    folder a kill leaves is refused by every reader. On an error the staging folder is removed."""
    tmp = staging_path(out)
    _remove(tmp)
    tmp.mkdir(parents=True)
    try:
        write(tmp)
    except BaseException:
        _remove(tmp)
        raise
    swap_in(tmp, out)
