"""Helpers of the serve tests: free loopback ports, `bertkit serve` as a process or in a thread,
small checkpoints of every head, headless chromium."""
from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import torch

from bertkit import Tokenizer, preset
from bertkit.checkpoint import build, save_model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port: int, proc: subprocess.Popen | None = None, seconds: float = 120) -> None:
    """Until the server answers /healthz (open without the API key; uvicorn listens only once the
    app's startup - model warm-up - is done)."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).status == 200:
                return
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise AssertionError("server exited: " + (proc.stderr.read()[-2000:] if proc.stderr else ""))
            time.sleep(0.2)
    raise AssertionError(f"server not ready in {seconds:g} s")


def start_server(model: Path, *extra: str) -> tuple[subprocess.Popen, int]:
    """`bertkit serve --model MODEL` on a free loopback port, one thread; ready when returned."""
    port = free_port()
    cmd = [sys.executable, "-m", "bertkit", "serve", "--model", str(model), "--port", str(port), "--threads", "1",
           "--log-level", "warning", "--no-small-batches", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(port, proc)
    except AssertionError:
        proc.kill()
        raise
    return proc, port


@contextlib.contextmanager
def server_thread(app, **config) -> Iterator[int]:
    """An ASGI app under uvicorn in a thread of this process (no signals); yields the port."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_ready(port, seconds=60)
        yield port
    finally:
        server.should_exit = True
        thread.join(30)


def tiny_checkpoint(root: Path, head: str, vocab: Path, names=None, **head_args) -> Path:
    """A small random-weight checkpoint of `head` with the real vocabulary of `vocab`."""
    torch.manual_seed(0)
    tok = Tokenizer.from_dir(vocab)
    cfg = preset("tiny", vocab_size=tok.vocab_size, max_position_embeddings=64)
    model = build(head, cfg, **head_args)
    for p in model.parameters():
        if p.dim() > 1:
            p.data.normal_(0, 0.2)                  # outputs that differ between inputs
    out = root / head
    save_model(model, out, extra_config={"id2label": {str(i): n for i, n in enumerate(names)}} if names else None)
    tok.save(out)
    return out


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def chromium(url: str, *flags: str, timeout: float = 90) -> str:
    """Headless chromium on url: --dump-dom (the DOM once the page's requests have finished, up
    to 20 s of virtual time) or whatever `flags` ask (--screenshot=FILE). Returns stdout."""
    with tempfile.TemporaryDirectory() as profile:
        cmd = [chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--hide-scrollbars", f"--user-data-dir={profile}", "--virtual-time-budget=20000", *flags, url]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return done.stdout
