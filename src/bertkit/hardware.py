"""What this machine runs fast: the CPU's model and ISA flags, and bf16 GEMM speed *measured*.

Flags do not say whether bf16 pays. An Intel Xeon with AMX multiplies bf16 tiles 3-6x faster
than fp32; an AMD EPYC Zen 4 (AVX512_BF16 dot products) about 2-2.5x; a CPU with AVX2 only has
no bf16 arithmetic at all, and bf16 GEMMs there run 10-40x *slower* than fp32 (converted in
software). So `capabilities()` times a GEMM of the model's FFN shape in fp32 and in bf16 (a few
milliseconds, once per process and shape) and reports the ratio, together with what the CPU
says it has. `bf16_fast()` is the yes/no that inference (`infer.Predictor`) uses, `choose_precision()`
the autocast dtype pre-training and fine-tuning take from it. `attention_kernel()` times a training
step of attention through torch's SDPA and through the formula written out (`packing.attention`):
torch's bf16 flash-attention backward is 2-3x slower than the formula on an AMD EPYC Zen 4.

A measurement is made once per machine, not once per process: the first process that needs it times
it and writes it to a small JSON file (`measurements_path()`: `$BERTKIT_CACHE_DIR`, else
`$XDG_CACHE_HOME/bertkit`, else `~/.cache/bertkit`), keyed by the CPU model, its flags, the thread
count, the torch version and bertkit's; every later process on that machine reads the same answer.
Timings flip on a loaded machine, and a choice that flips between two runs of one command changes
their results.
Delete the file to measure again (`bertkit info` names it). Options pin every choice (`--precision`,
`train.attention`); the environment (`BERTKIT_BF16=1` treats bf16 as fast, `0` as slow) is a switch
for tests.

    >>> from bertkit.hardware import capabilities
    >>> capabilities().summary()
    'AMD EPYC (avx512_bf16 avx512_vnni avx512f avx2; torch AVX512): bf16 GEMM 2.05x fp32 (measured) -> bf16'
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from . import __version__
from .errors import BertkitError
from .model import alibi_slopes, attention_bias
from .packing import GROUP_OVERHEAD_PAIRS, attention, packed_attention, packing

log = logging.getLogger("bertkit")

ENV = "BERTKIT_BF16"
MIN_SPEEDUP = 1.3          # bf16 must beat fp32 by this much: clusters measured at 0.03-0.1, 2-2.5, 3-6
FLAGS = ("amx_bf16", "amx_int8", "amx_tile", "avx512_bf16", "avx512_vnni", "avx512f", "avx2", "bf16")
_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class Capabilities:
    cpu: str                       # model name, e.g. "Intel(R) Xeon(R) Platinum 8488C"
    flags: tuple[str, ...]         # which of FLAGS the CPU reports
    torch_isa: str                 # the kernels torch dispatches to: "AVX512", "AVX2", "DEFAULT"...
    bf16_speedup: float | None     # fp32 GEMM time / bf16 GEMM time (None: not measured)
    bf16_fast: bool                # whether bf16 is the faster precision here
    reason: str                    # how bf16_fast was decided

    def summary(self) -> str:
        """One line for `bertkit info` and logs."""
        flags = " ".join(f for f in self.flags if f != "amx_tile") or "no bf16/AVX flags"
        return f"{self.cpu} ({flags}; torch {self.torch_isa}): {self.reason} -> {'bf16' if self.bf16_fast else 'fp32'}"


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else what `platform` knows)."""
    info = _cpuinfo()
    for key in ("model name", "Model", "Hardware", "cpu model"):
        if info.get(key):
            return info[key]
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_flags() -> tuple[str, ...]:
    """The ISA flags of FLAGS that the CPU reports (x86 `flags`, ARM `Features`)."""
    info = _cpuinfo()
    have = set((info.get("flags") or info.get("Features") or "").split())
    return tuple(f for f in FLAGS if f in have)


def pick_device(name: str | None) -> torch.device:
    """The device a run names ('cpu', 'cuda', 'cuda:1'); 'auto' or None: the GPU where there is one."""
    return torch.device(name if name not in (None, "auto") else "cuda" if torch.cuda.is_available() else "cpu")


def machine_facts() -> dict:
    """The machine a run ran on, for run cards and figures: platform, versions, CPU (model, bf16
    flags), threads, GPU."""
    info: dict = {"platform": platform.platform(), "python": platform.python_version(),
                  "torch": torch.__version__, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                  "cpu": cpu_model(), "cpu_bf16": [f for f in cpu_flags() if f in ("amx_bf16", "avx512_bf16")],
                  "denormals": _denormals}
    if torch.cuda.is_available():
        info.update(gpu=torch.cuda.get_device_name(), gpu_count=torch.cuda.device_count(), cuda=torch.version.cuda)
    return info


DENORMALS_ENV = "BERTKIT_KEEP_DENORMALS"
_denormals = "kept"          # what `denormals_flushed` does in this process (machine_facts, the run card)


@contextlib.contextmanager
def denormals_flushed():
    """Denormal floats (magnitude under 1.2e-38) flushed to zero (FTZ/DAZ) inside the block, on this
    thread and on every thread it starts there: torch's worker threads inherit it when they are made,
    at the process's first parallel operation, and keep it after the block (the calling thread does
    not). The `bertkit` command runs in it from before its first tensor operation;
    BERTKIT_KEEP_DENORMALS=1 keeps them, and the library never changes it. Why:
    ALiBi's far-off attention probabilities, and their gradients, are denormal in fp32, and a CPU
    computes on denormals many times slower than on other floats. Flushed, fp32 ALiBi training runs
    faster with bit-identical losses and weights in every run measured (docs/pretrain-measurements.md).
    Yields what was done."""
    global _denormals
    if os.environ.get(DENORMALS_ENV) == "1":
        yield f"denormal floats kept ({DENORMALS_ENV}=1)"
        return
    if not torch.set_flush_denormal(True):
        yield "denormal floats kept (this CPU cannot flush them)"
        return
    _denormals = "flushed to zero"
    try:
        yield "denormal floats flushed to zero (FTZ/DAZ)"
    finally:
        torch.set_flush_denormal(False)
        _denormals = "kept"


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break                                   # the first processor is enough
                key, _, value = line.partition(":")
                out.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return out


def busy() -> str | None:
    """'load L on N cores' when the 1-minute load average exceeds the machine's cores (other work
    competes with a timing made now), else None (or where the platform has no load average)."""
    try:
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
    except (AttributeError, OSError):
        return None
    return f"load {load:.1f} on {cores} cores" if load > cores else None


def best_times(fns, rounds: int, settle: float = 0.0) -> list[float]:
    """Fastest of `rounds` interleaved runs of each function (after one warm-up run each):
    interleaving and the minimum keep a noisy, shared machine from favouring either. `settle`:
    before each run, wait up to that many seconds for the process's other threads to go idle
    (`quiet`), for functions on different runtimes, whose worker threads spin-wait after a call and
    would take the cores from the function timed next."""
    for f in fns:
        f()
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, f in enumerate(fns):
            if settle:
                quiet(settle)
            t0 = time.perf_counter()
            f()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def quiet(limit: float, step: float = 0.005) -> float:
    """Sleep until this process's other threads are idle, `limit` seconds at most; returns the seconds
    slept. Idle: the process's CPU time grows by less than a tenth of a core over a `step` in which
    this thread sleeps. How long a runtime's workers spin after a call depends on the runtime and
    the CPU (docs/serve-measurements.md), so it is watched rather than assumed. On Windows, whose
    process CPU time moves in ~16 ms ticks, it sleeps `limit`."""
    if sys.platform == "win32":
        time.sleep(limit)
        return limit
    start = time.perf_counter()
    while True:
        cpu, wall = time.process_time(), time.perf_counter()
        time.sleep(step)
        now = time.perf_counter()
        if time.process_time() - cpu < 0.1 * (now - wall) or now - start >= limit:
            return now - start


def measure_bf16_speedup(hidden: int = 384, intermediate: int = 1536, tokens: int | None = None,
                         rounds: int = 3) -> float:
    """fp32 / bf16 time of a (tokens, hidden) x (hidden, intermediate) GEMM, the FFN's first
    Linear, on one thread (the per-core ratio: threads scale both alike, and one thread is least
    disturbed by other processes). `tokens` defaults to a fixed budget of ~38M multiply-adds
    (64 tokens at all-MiniLM-L6-v2's width, 16 at BERT-base's): about 10 ms in all. A small
    probe runs first: where bf16 is emulated it is already 2x slower on a (32, hidden) x
    (hidden, hidden) GEMM, and the big one is skipped."""
    tokens = tokens or max(8, round(64 * 384 * 1536 / (hidden * intermediate)))
    threads = torch.get_num_threads()
    g = torch.Generator().manual_seed(0)
    try:
        torch.set_num_threads(1)
        with torch.inference_mode():
            for m, n, r in ((32, hidden, 2), (tokens, intermediate, rounds)):
                x, w = torch.randn(m, hidden, generator=g), torch.randn(n, hidden, generator=g)
                xb, wb = x.bfloat16(), w.bfloat16()
                t32, t16 = best_times([lambda: F.linear(x, w), lambda: F.linear(xb, wb)], r)
                speedup = t32 / t16
                if speedup < 0.5:
                    break
    except RuntimeError:                                   # no bf16 GEMM in this build
        speedup = 0.0
    finally:
        torch.set_num_threads(threads)
    return speedup


_PEAKS: dict[tuple, float] = {}     # gemm_peak's figures in this process: (device, dtype, threads, n) -> FLOP/s


def gemm_peak(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, n: int | None = None,
              repeats: int = 5, budget_s: float = 1.0) -> float:
    """Best FLOP/s of an n x n @ n x n matmul (the MFU denominator; n: 1024 on the CPU, 8192 on a GPU,
    where a 1024 product is mostly launch: it read an H200 at 135-176 of its ~790 bf16 TFLOP/s), measured
    at its first call in this process for a device, dtype and thread count, and reused after (~1 s each: many runs in
    one process - ablation arms, tests - measure once). The size grows from 128 to n only while one
    product takes under 20 ms (bf16 emulated on an AVX2-only CPU runs 1024^3 in ~1.5 s), and the
    repeats stop after `budget_s`: the figure of a slow path costs a fraction of a second, not half
    a minute at the end of every run."""
    device = torch.device(device)
    n = n or (8192 if device.type == "cuda" else 1024)
    key = (str(device), dtype, torch.get_num_threads(), n)
    if key not in _PEAKS:
        _PEAKS[key] = _measure_gemm_peak(device, dtype, n, repeats, budget_s)
    return _PEAKS[key]


def _measure_gemm_peak(device: torch.device, dtype: torch.dtype, n: int, repeats: int, budget_s: float) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    g = torch.Generator(device=device).manual_seed(0)       # torch's own generator is the run's: untouched

    def product_time(m: int, inner: int) -> float:
        a, b = (torch.randn(m, m, device=device, dtype=dtype, generator=g) for _ in range(2))
        sync()
        t0 = time.perf_counter()
        for _ in range(inner):
            a @ b
        sync()
        return time.perf_counter() - t0

    size = 128
    while size < n and min(product_time(size, 1) for _ in range(2)) < 0.02:    # the first call warms up
        size *= 2
    n = min(size, n)
    inner = 20 if device.type == "cuda" else 3
    best, start = 0.0, time.perf_counter()
    for _ in range(repeats + 1):
        best = max(best, inner * 2 * n ** 3 / product_time(n, inner))
        if time.perf_counter() - start > budget_s:
            break
    return best


# ---- measurements made once per machine -------------------------------------------------------------
CACHE_ENV = "BERTKIT_CACHE_DIR"


def measurements_path() -> Path:
    """The file that holds this machine's measurements (see the module docstring)."""
    root = os.environ.get(CACHE_ENV) or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bertkit"
    return Path(root) / "measurements.json"


def machine_key() -> str:
    """What a measurement depends on besides its own shape: the CPU, its flags, threads, torch, and
    bertkit's version (a new release times its own code again, not its predecessor's records)."""
    return (f"{cpu_model()} [{' '.join(cpu_flags())}] {torch.get_num_threads()} threads torch {torch.__version__}"
            f" bertkit {__version__}")


def _read_measurements(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError, UnicodeDecodeError):
        return {}


_session: dict[str, object] = {}    # where the file cannot be written: one answer per process at least


def measured_once(name: str, measure: Callable[[], float]) -> float:
    """`measure()` for this machine and `name` (a shape), read from the machine's measurements file
    when an earlier process made it; else measured now and written there (atomically; of two
    processes measuring at once, the first to write wins and the other takes its answer)."""
    return float(decided_once(name, lambda: float(measure()), lambda v: isinstance(v, (int, float))))


def recorded(name: str) -> object | None:
    """What `decided_once(name, ...)` holds for this machine (this process's answer, else the
    measurements file's), or None where nothing is recorded; it measures nothing."""
    key = f"{machine_key()} :: {name}"
    if key in _session:
        return _session[key]
    entry = _read_measurements(measurements_path()).get(key)
    return entry.get("value") if isinstance(entry, dict) else None


def decided_once(name: str, decide: Callable[[], object], valid: Callable[[object], bool]) -> object:
    """`measured_once` for any JSON value `decide()` returns (`valid` tells a usable recorded one).
    `decide()` runs on a fork of torch's CPU generator: a run that measures goes on with the same random
    numbers as one that reads the recorded answer (a timing with dropout draws from it)."""
    key = f"{machine_key()} :: {name}"
    value = recorded(name)
    if valid(value):
        _session[key] = value
        return value
    path = measurements_path()
    with torch.random.fork_rng(devices=[]):
        value = decide()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _read_measurements(path)
        won = data.get(key)
        if isinstance(won, dict) and valid(won.get("value")):
            value = won["value"]                         # another process measured first: take its answer
        else:
            data[key] = {"value": value, "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
            fd, tmp = tempfile.mkstemp(prefix=".measurements-", dir=path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
    except OSError as e:
        log.warning("could not record the measurement %s in %s (%s): later processes measure again", name, path, e)
    _session[key] = value
    return value


def _measured(hidden: int, intermediate: int) -> float:
    return measured_once(f"bf16 GEMM speedup {hidden}x{intermediate}",
                         lambda: measure_bf16_speedup(hidden, intermediate))


def env_override() -> bool | None:
    """BERTKIT_BF16 as True / False, or None when unset or 'auto' (then bf16 speed is measured)."""
    raw = os.environ.get(ENV, "").strip().lower()
    if raw in ("", "auto"):
        return None
    if raw in _ON:
        return True
    if raw in _OFF:
        return False
    raise BertkitError(f"{ENV}={os.environ[ENV]!r}: expected 1 (bf16 is fast here), 0 (it is not) or auto")


def capabilities(hidden: int = 384, intermediate: int = 1536) -> Capabilities:
    """This CPU, and whether bf16 is faster than fp32 on it for a model of this width
    (measured once per process and shape; BERTKIT_BF16 overrides)."""
    forced = env_override()
    if forced is not None:
        speedup, fast, reason = None, forced, f"{ENV}={int(forced)}"
    else:
        speedup = _measured(int(hidden), int(intermediate))
        fast = speedup >= MIN_SPEEDUP
        reason = f"bf16 GEMM {speedup:.3g}x fp32 (measured once on this machine)"
    return Capabilities(cpu_model(), cpu_flags(), torch.backends.cpu.get_cpu_capability(), speedup, fast, reason)


def bf16_fast(hidden: int = 384, intermediate: int = 1536) -> bool:
    """Whether bf16 matrix multiplies are faster than fp32 on this CPU (see `capabilities`)."""
    return capabilities(hidden, intermediate).bf16_fast


# ---- which attention kernel training runs -----------------------------------------------------------
ATTENTION_ENV = "BERTKIT_ATTENTION"
MIN_ATTENTION_SPEEDUP = 1.2   # the written-out kernel must beat SDPA by this much


def measure_attention_speedup(heads: int, head_dim: int, length: int = 128, dtype: torch.dtype = torch.bfloat16,
                              batch: int = 8, rounds: int = 3, dropout_p: float = 0.0,
                              slopes: torch.Tensor | None = None, causal: bool = False) -> float:
    """SDPA time / `packing.attention(kernel='math')` time for one training step of attention
    (forward + backward, (batch, heads, length, head_dim) in `dtype`, the model's attention dropout
    `dropout_p`), on one thread: about 0.1-0.3 s in all. Which is faster depends on the CPU (the
    module's doc), so it is timed, not assumed. The mask is the one the model trains with
    (`model.attention_bias` of a padded batch, sequences of length/2 to length): boolean, causal
    where the model is, or with ALiBi `slopes` their additive bias (-inf where not allowed). The
    mask and the dropout count: a slope-1 head's far-off probabilities are fp32 denormals, which
    slow both kernels unless the process flushes them (`denormals_flushed`), and SDPA draws dropout
    with torch's scalar Bernoulli, the written-out kernel with `packing.dropout`, both from torch's
    generator (`decided_once` forks it; the figures: docs/pretrain-measurements.md)."""
    threads = torch.get_num_threads()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, length, head_dim, generator=g).to(dtype).requires_grad_() for _ in range(3))
    grad = torch.randn(batch, heads, length, head_dim, generator=g).to(dtype)
    lengths = torch.linspace(length, (length + 1) // 2, batch).round()
    mask = attention_bias(torch.arange(length)[None, :] < lengths[:, None], q, causal, slopes)

    def step(kernel: str):
        return lambda: attention(q, k, v, mask, dropout_p, kernel=kernel).backward(grad)
    try:
        torch.set_num_threads(1)
        sdpa, math = best_times([step("sdpa"), step("math")], rounds)
    except RuntimeError:                                   # a dtype this build cannot run
        return 0.0
    finally:
        torch.set_num_threads(threads)
    return sdpa / math


def attention_kernel(device: torch.device, dtype: torch.dtype, model_cfg, length: int = 128,
                     asked: str = "auto") -> tuple[str, str]:
    """What computes a model's attention while it trains, and why: `asked` ('sdpa' or 'math') where
    given; else torch's SDPA, except on a CPU where the written-out formula (`packing.attention`,
    kernel 'math') is measured faster for its heads, `length` and autocast `dtype`. Measured once per
    machine (`measured_once`); BERTKIT_ATTENTION=sdpa|math overrides 'auto' (a switch for tests)."""
    if asked in ("sdpa", "math"):
        return asked, f"asked: {asked}"
    if asked != "auto":
        raise BertkitError(f"attention kernel {asked!r}: expected auto, sdpa or math")
    if device.type != "cpu":
        return "sdpa", f"SDPA on {device.type}"
    heads = int(model_cfg.num_heads)
    head_dim = int(model_cfg.hidden_size // heads)
    raw = os.environ.get(ATTENTION_ENV, "").strip().lower()
    if raw in ("sdpa", "math"):
        return raw, f"{ATTENTION_ENV}={raw}"
    if raw not in ("", "auto"):
        raise BertkitError(f"{ATTENTION_ENV}={os.environ[ATTENTION_ENV]!r}: expected sdpa, math or auto")
    name, p = dtype_name(dtype), float(getattr(model_cfg, "attention_dropout", 0.0) or 0.0)
    with_p = f" with dropout {p:g}" if p else ""
    slopes, causal = alibi_slopes(model_cfg), bool(getattr(model_cfg, "causal", False))
    mask = ("causal " if causal else "") + ("padding mask" if slopes is None else "ALiBi bias")
    speedup = measured_once(f"attention math/SDPA speedup {heads}x{head_dim} T{int(length)} {name}{with_p}, {mask}",
                            lambda: measure_attention_speedup(heads, head_dim, int(length), dtype, dropout_p=p,
                                                              slopes=slopes, causal=causal))
    kernel = "math" if speedup >= MIN_ATTENTION_SPEEDUP else "sdpa"
    return kernel, f"{name} attention forward + backward{with_p}, {mask}: the math kernel {speedup:.3g}x as fast " \
                   f"as SDPA (measured once on this machine)"


def attention_forward_speedup(heads: int, head_dim: int, length: int, dtype: torch.dtype, batch: int = 32,
                              rounds: int = 15) -> float:
    """SDPA time / kernel 'chunked' time for the attention of two inference batches as a Predictor
    runs them (packed tokens, Q, K and V views of one projection): `batch` sequences of `length`
    tokens and `batch` of `length` down to 8, on torch's threads, measured once per machine
    (`measured_once`): which kernel a Predictor runs. On packed tokens 'chunked' is one sequence
    at a time (`packing._sequence_attention`; docs/serve-measurements.md)."""
    def measure() -> float:
        g = torch.Generator().manual_seed(0)
        cases = []
        for lengths in (torch.full((batch,), length), torch.linspace(length, 8, batch).round().long()):
            qkv = torch.randn(int(lengths.sum()), 3, heads, head_dim, generator=g).to(dtype)
            cases.append((*qkv.unbind(1), packing(torch.arange(length)[None, :] < lengths[:, None])))

        def run(kernel: str):
            return lambda: [packed_attention(q, k, v, p, kernel=kernel) for q, k, v, p in cases]
        try:
            with torch.inference_mode():
                sdpa, chunked = best_times([run("sdpa"), run("chunked")], rounds)
        except RuntimeError:                               # a dtype this build cannot run: SDPA stays
            return 0.0
        return sdpa / chunked
    name = dtype_name(dtype)
    return measured_once(f"packed attention forward chunked/SDPA speedup {batch}x{heads}x{head_dim} T{length} {name}",
                         measure)


def attention_group_overhead(heads: int, head_dim: int, dtype: torch.dtype,
                             candidates: tuple[int, ...] = (GROUP_OVERHEAD_PAIRS, 100), rounds: int = 7) -> int:
    """Which of `candidates` (what one more attention call costs, in padded pairs: `packing.attention_groups`)
    runs a ragged inference batch's attention fastest here: 32 sequences of 8-128 tokens, longest first,
    on torch's threads, in `dtype` with SDPA (the kernel that uses length groups); the first candidate
    unless another is more than 5% faster. Decided once per machine (`decided_once`): more, smaller
    groups pay where a masked SDPA call costs more than the calls it replaces (docs/serve-measurements.md)."""
    def decide() -> int:
        g = torch.Generator().manual_seed(0)
        lengths = torch.linspace(128, 8, 32).round().long()
        mask = torch.arange(128)[None, :] < lengths[:, None]
        q, k, v = (torch.randn(int(lengths.sum()), heads, head_dim, generator=g).to(dtype) for _ in range(3))

        def run(c: int):
            return lambda: packed_attention(q, k, v, packing(mask), kernel="sdpa", group_overhead=c)
        try:
            with torch.inference_mode():
                times = best_times([run(c) for c in candidates], rounds)
        except RuntimeError:
            return candidates[0]
        best = min(range(len(candidates)), key=lambda i: times[i])
        return candidates[best] if times[0] > 1.05 * times[best] else candidates[0]
    name = dtype_name(dtype)
    return int(decided_once(f"attention group overhead {heads}x{head_dim} {name} sdpa of {list(candidates)}",
                            decide, lambda v: isinstance(v, int) and v in candidates))


def deterministic(device: torch.device, on: bool) -> str:
    """Deterministic training on `device`, switched on or off; returns what the run card says. On a GPU
    `on` calls torch.use_deterministic_algorithms (and fixes cuBLAS's workspace, which it requires):
    two runs of one command then give the same weights bit for bit, at some cost in speed. Off, the
    GPU's backward adds with unordered atomics (the embedding gradient, attention's), and two GPU
    runs differ in the last bits, then more (measured: docs/REPRODUCTION.md, the GPU grid). The
    CPU path is deterministic for a given number of threads either way. Call it before the first GPU
    matrix product of the process: cuBLAS reads its workspace setting when it starts."""
    if device.type != "cuda":
        return f"{'on' if on else 'off'}: the CPU path is deterministic for a given number of threads either way"
    if not on:
        return ("off: GPU atomics make two runs differ in the last bits (pretrain --train.deterministic, "
                "finetune --deterministic)")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    return f"on: torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG={os.environ['CUBLAS_WORKSPACE_CONFIG']}"


PRECISION_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}   # one name everywhere


def dtype_name(dtype: torch.dtype) -> str:
    """torch's name of a dtype without the module: 'bfloat16'."""
    return str(dtype).replace("torch.", "")


def choose_precision(name: str, device: torch.device, model_cfg, key: str = "precision") -> tuple[torch.dtype, str]:
    """The autocast dtype a run trains in, and why (`key`: the setting's name, for messages).
    'auto': bf16 on a GPU that has it; on a CPU, bf16 where a bf16 GEMM of the model's FFN shape is
    measured faster than fp32 (AMX, AVX512-BF16: `capabilities`), fp32 elsewhere (an AVX2-only
    CPU emulates bf16 10-40x slower). Weights and optimizer state stay fp32 either way."""
    hidden, inner = model_cfg.hidden_size, model_cfg.intermediate_size
    if name == "auto":
        if device.type == "cuda":
            bf16 = torch.cuda.is_bf16_supported()
            return (torch.bfloat16 if bf16 else torch.float32), f"auto: {'bf16' if bf16 else 'no bf16'} on this GPU"
        caps = capabilities(hidden, inner)
        return (torch.bfloat16 if caps.bf16_fast else torch.float32), f"auto: {caps.reason}"
    if name == "fp16" and device.type != "cuda":
        raise BertkitError(f"{key}=fp16 needs a GPU; use fp32 (or bf16) on CPU")
    if name == "bf16" and device.type == "cpu" and not (caps := capabilities(hidden, inner)).bf16_fast:
        log.warning("%s=bf16 on a CPU where bf16 matrix multiplies are slower than fp32 (%s)", key, caps.reason)
    dtypes = {v: k for k, v in PRECISION_NAMES.items()}
    if name not in dtypes:
        raise BertkitError(f"{key}={name!r}: expected auto, fp32, bf16 or fp16")
    return dtypes[name], f"asked: {key}={name}"


def git_commit() -> str:
    """The checkout's short commit (+ 'uncommitted changes'), or the version outside a git checkout: what a
    dated figure names beside the CPU."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not sha:
        return f"bertkit {__version__} (not a git checkout)"
    return sha + (" + uncommitted changes" if dirty else "")
