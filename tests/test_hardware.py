"""hardware: CPU model and flags, bf16 speed measured (never assumed), the BERTKIT_BF16 override."""
from __future__ import annotations

import contextlib
import json
import math
import time

import pytest
import torch

from bertkit import hardware
from bertkit.errors import BertkitError


def _no_measuring(*a, **k):
    raise AssertionError("bf16 speed was measured although BERTKIT_BF16 decides")


@pytest.mark.parametrize("value, fast", [("1", True), ("on", True), ("0", False), ("false", False)])
def test_env_override_decides_without_measuring(monkeypatch, value, fast):
    monkeypatch.setenv("BERTKIT_BF16", value)
    monkeypatch.setattr(hardware, "_measured", _no_measuring)
    caps = hardware.capabilities()
    assert caps.bf16_fast is fast and caps.bf16_speedup is None
    assert caps.reason == f"BERTKIT_BF16={int(fast)}"
    assert hardware.bf16_fast() is fast


@pytest.mark.parametrize("speedup, fast", [(0.04, False), (1.0, False), (2.4, True), (5.0, True)])
def test_measured_speedup_decides(monkeypatch, speedup, fast):
    monkeypatch.setenv("BERTKIT_BF16", "auto")
    monkeypatch.setattr(hardware, "_measured", lambda h, i: speedup)
    caps = hardware.capabilities(768, 3072)
    assert caps.bf16_fast is fast and caps.bf16_speedup == speedup
    assert "measured" in caps.reason
    line = caps.summary()
    assert "\n" not in line and line.endswith("-> bf16" if fast else "-> fp32") and caps.cpu in line


def test_bad_override_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("BERTKIT_BF16", "maybe")
    with pytest.raises(BertkitError, match="BERTKIT_BF16='maybe': expected 1") as e:
        hardware.capabilities()
    assert "\n" not in str(e.value)


def test_flags_come_from_cpuinfo(monkeypatch):
    fake = {"model name": "Intel(R) Xeon(R) Platinum 8488C", "flags": "fpu avx2 avx512f amx_tile amx_bf16 avx512_bf16"}
    monkeypatch.setattr(hardware, "_cpuinfo", lambda: fake)
    assert hardware.cpu_model() == "Intel(R) Xeon(R) Platinum 8488C"
    assert hardware.cpu_flags() == ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2")
    monkeypatch.setattr(hardware, "_cpuinfo", lambda: {})
    assert hardware.cpu_model() and hardware.cpu_flags() == ()


def test_the_measurement_runs_here_and_restores_threads():
    threads = torch.get_num_threads()
    speedup = hardware.measure_bf16_speedup(hidden=64, intermediate=256, tokens=32)
    assert torch.get_num_threads() == threads
    assert math.isfinite(speedup) and speedup >= 0
    x86 = torch.backends.cpu.get_cpu_capability() not in ("DEFAULT",) and hardware._cpuinfo().get("flags")
    if x86 and not {"avx512_bf16", "amx_bf16"} & set(hardware.cpu_flags()):
        # no bf16 arithmetic on this x86 CPU: bf16 is converted in software, never the faster one
        assert speedup < hardware.MIN_SPEEDUP, speedup


def test_info_says_what_runs_here(capsys, monkeypatch, minilm):
    import json

    from bertkit.cli import main

    for value, ending in (("0", "BERTKIT_BF16=0 -> fp32"), ("1", "BERTKIT_BF16=1 -> bf16 if it matches fp32 at load")):
        monkeypatch.setenv("BERTKIT_BF16", value)
        assert main(["info", str(minilm)]) == 0
        line = [l for l in capsys.readouterr().out.splitlines() if l.startswith("runs here")]
        assert len(line) == 1 and line[0].endswith(ending) and hardware.cpu_model() in line[0]
    assert main(["info", "--json", str(minilm)]) == 0
    assert json.loads(capsys.readouterr().out)["hardware"]["bf16_fast"] is True


def test_choose_precision_names_the_setting_and_follows_the_measurement(monkeypatch):
    from bertkit.config import preset

    cpu, cfg = torch.device("cpu"), preset("tiny", vocab_size=100)
    for env, dtype in (("1", torch.bfloat16), ("0", torch.float32)):
        monkeypatch.setenv("BERTKIT_BF16", env)
        got, why = hardware.choose_precision("auto", cpu, cfg, "precision")
        assert got == dtype and why == f"auto: BERTKIT_BF16={env}"
    assert hardware.choose_precision("fp32", cpu, cfg, "train.precision") == (torch.float32,
                                                                              "asked: train.precision=fp32")
    with pytest.raises(BertkitError, match="^train.precision=fp16 needs a GPU"):
        hardware.choose_precision("fp16", cpu, cfg, "train.precision")
    with pytest.raises(BertkitError, match="precision='half'"):
        hardware.choose_precision("half", cpu, cfg)


def test_a_measurement_is_made_once_per_machine_and_reused_by_later_processes(monkeypatch, tmp_path):
    monkeypatch.setenv(hardware.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(hardware, "_session", {})
    calls = []
    assert hardware.measured_once("gemm 8x8", lambda: calls.append(1) or 2.5) == 2.5
    monkeypatch.setattr(hardware, "_session", {})                 # a second process on the same machine
    assert hardware.measured_once("gemm 8x8", lambda: calls.append(1) or 0.4) == 2.5 and calls == [1]
    saved = json.loads((tmp_path / "measurements.json").read_text())
    key = next(iter(saved))
    assert key.startswith(hardware.machine_key()) and key.endswith(":: gemm 8x8") and saved[key]["value"] == 2.5
    # another shape, or another machine (CPU, flags, threads, torch), is measured anew
    assert hardware.measured_once("gemm 16x16", lambda: 3.0) == 3.0
    monkeypatch.setattr(hardware, "_session", {})
    monkeypatch.setattr(hardware, "machine_key", lambda: "Other CPU [avx2] 2 threads torch 2.13")
    assert hardware.measured_once("gemm 8x8", lambda: 0.2) == 0.2
    # an unreadable file is measured again, an unwritable folder still gives one answer per process
    (tmp_path / "measurements.json").write_text("{not json")
    monkeypatch.setattr(hardware, "_session", {})
    assert hardware.measured_once("gemm 8x8", lambda: 0.3) == 0.3


def test_gemm_peak_is_measured_once_per_device_dtype_and_threads(monkeypatch):
    """The MFU denominator costs ~1 s to measure: a process running many runs measures it once per
    (device, dtype, thread count) and gives every run the same figure."""
    import torch

    calls = []
    monkeypatch.setattr(hardware, "_PEAKS", {})
    monkeypatch.setattr(hardware, "_measure_gemm_peak", lambda *a: calls.append(a) or 1e9 * len(calls))
    assert hardware.gemm_peak("cpu") == hardware.gemm_peak("cpu") == 1e9
    assert hardware.gemm_peak("cpu", torch.bfloat16) == 2e9          # another dtype: measured
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        assert hardware.gemm_peak("cpu") == 3e9                      # another thread count: measured
    finally:
        torch.set_num_threads(threads)
    assert hardware.gemm_peak("cpu") == 1e9 and len(calls) == 3
    assert [c[2] for c in calls] == [1024] * 3                       # the CPU's product size
    hardware.gemm_peak("cuda")                                       # not run: the size a GPU needs
    assert calls[-1][0] == torch.device("cuda") and calls[-1][2] == 8192


def test_gemm_peak_measures_a_real_matmul():
    import torch

    torch.manual_seed(0)
    want = torch.rand(3)
    torch.manual_seed(0)
    assert 1e8 < hardware._measure_gemm_peak(torch.device("cpu"), torch.float32, 256, 2, 0.2) < 1e14
    assert torch.equal(torch.rand(3), want)         # its own generator: a run's random numbers are untouched


def test_machine_facts_name_the_cpu_and_threads():
    import torch

    facts = hardware.machine_facts()
    assert facts["cpu"] == hardware.cpu_model() and facts["torch_threads"] == torch.get_num_threads()
    assert set(facts["cpu_bf16"]) <= {"amx_bf16", "avx512_bf16"} and facts["torch"] == torch.__version__


def test_best_times_settles_before_each_timed_run_when_asked(monkeypatch):
    """Runtimes' worker threads spin after a call: with `settle`, every timed run (not the warm-ups)
    starts once the process is quiet (up to `settle` seconds), so one function's spinning threads do
    not slow the next one's timing."""
    events = []
    monkeypatch.setattr(hardware, "quiet", lambda s: events.append(("quiet", s)))
    fns = [lambda: events.append("a"), lambda: events.append("b")]
    assert len(hardware.best_times(fns, 2, settle=0.25)) == 2
    assert events == ["a", "b"] + [("quiet", 0.25), "a", ("quiet", 0.25), "b"] * 2
    events.clear()
    hardware.best_times(fns, 1)
    assert events == ["a", "b", "a", "b"]


def test_quiet_waits_while_another_thread_of_the_process_runs():
    """hardware.quiet: a thread of this process that keeps a core busy (as a runtime's spinning
    workers do) holds it back until that thread stops, or until its limit; an idle process passes
    after a few short steps."""
    import threading

    stop = time.perf_counter() + 0.3
    spinner = threading.Thread(target=lambda: [None for _ in iter(lambda: time.perf_counter() < stop, False)])
    spinner.start()
    waited = hardware.quiet(2.0)
    spinner.join()
    assert waited >= 0.2
    assert hardware.quiet(2.0) < 0.5
    stop = time.perf_counter() + 1.0
    spinner = threading.Thread(target=lambda: [None for _ in iter(lambda: time.perf_counter() < stop, False)])
    spinner.start()
    assert 0.1 <= hardware.quiet(0.1) < 0.5           # at most the limit (and a step)
    spinner.join()


def test_quiet_sleeps_its_limit_where_cpu_time_moves_in_coarse_ticks(monkeypatch):
    """On Windows the process's CPU time advances in ~16 ms ticks, too coarse for 5 ms steps: the
    whole limit, as a fixed pause."""
    slept = []
    monkeypatch.setattr(hardware.sys, "platform", "win32")
    monkeypatch.setattr(hardware.time, "sleep", slept.append)
    assert hardware.quiet(0.1) == 0.1 and slept == [0.1]


@pytest.mark.parametrize("second_time, want", [(0.90, 100), (0.98, 1000)])
def test_attention_group_overhead_takes_a_candidate_only_when_it_is_5_percent_faster(monkeypatch, tmp_path,
                                                                                      second_time, want):
    """hardware.attention_group_overhead: the fixed constant unless the finer split times more than 5%
    faster on the ragged batch; decided once per machine (the recorded answer, not a second timing)."""
    monkeypatch.setenv(hardware.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(hardware, "_session", {})
    calls = []

    def fake_best_times(fns, rounds, settle=0.0):
        calls.append(len(fns))
        for f in fns:
            f()                                       # the real attention runs, on a real ragged batch
        return [1.0, second_time]
    monkeypatch.setattr(hardware, "best_times", fake_best_times)
    assert hardware.attention_group_overhead(2, 16, torch.float32) == want
    monkeypatch.setattr(hardware, "_session", {})                 # a second process on the same machine
    assert hardware.attention_group_overhead(2, 16, torch.float32) == want
    assert calls == [2]


def test_denormals_are_flushed_on_every_thread_made_inside_and_said(monkeypatch):
    """hardware.denormals_flushed: inside, a denormal float is 0 on the calling thread and on torch's
    worker threads made there (they inherit it: half a large product is a worker's); after, the calling
    thread keeps denormals again; machine_facts (the run card) says which; BERTKIT_KEEP_DENORMALS=1 keeps them."""
    code = ("import torch\ntorch.set_num_threads(2)\n"
            "from bertkit.hardware import denormals_flushed, machine_facts\n"
            "def nonzero():\n    x = torch.full((1 << 22,), 1e-39)\n    return int(((x * 1.0) != 0).sum())\n"
            "with denormals_flushed() as said:\n    inside = nonzero(), machine_facts()['denormals']\n"
            "print(repr((said, inside, machine_facts()['denormals'], torch.tensor([1e-39]).item() != 0)))")
    import ast
    import os
    import subprocess
    import sys
    for keep in ("0", "1"):
        env = dict(os.environ, BERTKIT_KEEP_DENORMALS=keep)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        said, (nonzero, inside), after, main_thread_keeps = ast.literal_eval(out.stdout.strip().splitlines()[-1])
        if "cannot flush" in said:
            pytest.skip("this CPU cannot flush denormals (torch.set_flush_denormal needs SSE3)")
        if keep == "1":
            assert "kept (BERTKIT_KEEP_DENORMALS=1)" in said and nonzero == 1 << 22 and inside == "kept"
        else:
            assert said.startswith("denormal floats flushed") and nonzero == 0 and inside == "flushed to zero"
        assert after == "kept" and main_thread_keeps


def test_the_command_runs_torch_commands_with_denormals_flushed(monkeypatch, tmp_path, minilm, capsys):
    from bertkit import cli, hardware

    entered = []

    @contextlib.contextmanager
    def spy():
        entered.append(True)
        yield "flushed (spy)"
    monkeypatch.setattr(hardware, "denormals_flushed", spy)
    (tmp_path / "in.txt").write_text("hello world\n")
    assert cli.main(["tokenize", "--model", str(minilm), str(tmp_path / "in.txt")]) == 0 and not entered  # no torch
    assert cli.main(["info", str(tmp_path / "missing")]) == 1 and entered == [True]
