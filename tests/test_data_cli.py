"""The data commands end to end: tokenizer train/stats, prepare, data stats/show, error messages."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from bertkit.cli import main
from bertkit.data.pretraining import open_dataset
from bertkit.data.masking import Collator, MaskingConfig

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "src" / "bertkit" / "sample" / "inaugural.txt.gz"


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    docs = gzip.open(SAMPLE, "rt", encoding="utf-8").read().split("\n\n")[:8]
    (d / "c.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return d / "c.txt"


def test_tokenizer_train_loads_in_transformers(small_corpus, tmp_path, capsys):
    out = tmp_path / "tok"
    assert main(["tokenizer", "train", str(small_corpus), "--vocab-size", "600", "--out", str(out)]) == 0
    assert {"vocab.txt", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    from bertkit.tokenizer import Tokenizer
    ours = Tokenizer.from_dir(out)
    assert 500 <= ours.vocab_size <= 600 and ours.lowercase
    transformers = pytest.importorskip("transformers")
    text = "The Constitution of the United States, ratified in 1788."
    hf = transformers.AutoTokenizer.from_pretrained(str(out))
    assert hf(text)["input_ids"] == ours.encode(text).input_ids
    slow = transformers.BertTokenizer(str(out / "vocab.txt"), do_lower_case=True)
    assert slow(text)["input_ids"] == ours.encode(text).input_ids


def test_tokenizer_stats_json(minilm, small_corpus, capsys):
    assert main(["tokenizer", "stats", "--model", str(minilm), str(small_corpus), "--max-length", "64", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert 1.0 < s["pieces_per_word"] < 1.3 and s["unk_rate"] < 0.01
    assert 0 < s["words_3plus_pieces"] < 0.1 and 0 < s["pairs_truncated"] < 1 and s["documents_truncated"] == 1.0


def test_prepare_stats_show_and_collate(minilm, small_corpus, tmp_path, capsys):
    out = tmp_path / "data"
    assert main(["prepare", "--model", str(minilm), "--input", str(small_corpus), "--out", str(out),
                 "--max-length", "128", "--no-progress", "--workers", "2"]) == 0
    assert main(["data", "stats", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    for k in ("instances", "tokens", "max_length", "random_next_fraction", "short_fraction"):
        assert k in s
    m = s["masking"]
    assert s["max_length"] == 128 and s["longest"] <= 128 and s["malformed"] == 0
    assert abs(m["selected_fraction"] - 0.15) < 0.01
    assert abs(m["mask_fraction"] - 0.8) < 0.03 and abs(m["random_fraction"] - 0.1) < 0.03
    assert abs(m["mask_fraction"] + m["keep_fraction"] + m["random_fraction"] - 1) < 1e-9
    assert main(["data", "show", str(out), "-n", "2"]) == 0
    shown = capsys.readouterr().out
    assert shown.count("[CLS]") == 2 and "{[MASK]|" in shown and "  B: " in shown
    meta = json.loads((out / "meta.json").read_text())
    assert meta["command"] == (f"bertkit prepare --model {minilm} --input {small_corpus} --out {out} "
                               "--workers 2 --max_length 128")
    # the trainer's path: a batch from the folder, masks as the stats measured them
    ds = open_dataset(out)
    batch = Collator(ds, MaskingConfig(), seed=0)([ds[i] for i in range(8)], epoch=0)
    assert batch["input_ids"].shape[0] == 8 and batch["nsp_labels"].shape == (8,)
    assert ((batch["mlm_labels"] != -100).sum(1) >= 1).all()


def test_prepare_options_are_prepare_config_fields():
    """Every data option is a PrepareConfig field (masking ones as masking_config.KEY); the cap
    follows length and rate unless given."""
    from bertkit.cli import build_parser
    from bertkit.commands.data import command_line, prepare_config

    def parse(*extra):
        args = build_parser("prepare").parse_args(["prepare", "--model", "M", "--input", "a.txt", "--out", "O", *extra])
        return args, prepare_config(args)

    args, cfg = parse("--max-length", "512", "--masking-config.mask-prob", "0.15", "--masking_config.mode=whole_word",
                      "--no-nsp")
    assert (cfg.max_length, cfg.nsp, cfg.masking_config.mode) == (512, False, "whole_word")
    assert cfg.masking_config.max_predictions == 80                   # Google's 512 x 0.15 -> 80
    assert command_line(args) == ("bertkit prepare --model M --input a.txt --out O --max_length 512 --no-nsp "
                                  "--masking_config.mode whole_word --masking_config.mask_prob 0.15")
    _, same = parse("--max-length", "512", "--masking_config.mask_prob", "0.15", "--masking_config.mode",
                    "whole_word", "--nsp=false")
    assert same == cfg
    _, cfg = parse("--max_length", "64", "--masking_config.max_predictions", "7", "--masking_config.mode", "span",
                   "--masking", "static")
    assert (cfg.masking_config.max_predictions, cfg.masking_config.mode, cfg.dupe_factor) == (7, "span", 10)
    assert parse()[1].masking_config.max_predictions == 20                   # 128 x 0.15 -> 20


@pytest.mark.parametrize("extra, says", [
    (["--masking", "stat"], "did you mean 'static'"),
    (["--whole-word"], "--whole-word is now --masking_config.mode=whole_word"),     # former spellings: one line
    (["--masked-lm-prob", "0.2"], "--masked-lm-prob is now --masking_config.mask_prob"),
    (["--max_seq_length=64"], "--max_seq_length is now --max_length"),
    (["--max_lenght", "64"], "did you mean --max_length"), (["--nsp=maybe"], "--nsp")])
def test_prepare_usage_errors_name_the_option(minilm, small_corpus, tmp_path, capsys, extra, says):
    with pytest.raises(SystemExit) as e:
        main(["prepare", "--model", str(minilm), "--input", str(small_corpus), "--out", str(tmp_path / "o"), *extra])
    assert e.value.code == 1 and says in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_cli_errors_are_one_line(minilm, tmp_path, capsys):
    assert main(["prepare", "--model", str(minilm), "--input", str(tmp_path / "nope.txt"), "--out",
                 str(tmp_path / "o"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("bertkit prepare: error:") and "nope.txt" in err and "Traceback" not in err
    assert main(["data", "stats", str(tmp_path)]) == 1
    assert "not complete" in capsys.readouterr().err
    (tmp_path / "one.txt").write_text("Just one document.\nTwo lines.\n")
    assert main(["prepare", "--model", str(minilm), "--input", str(tmp_path / "one.txt"), "--out",
                 str(tmp_path / "o"), "--no-progress"]) == 1
    assert "--no-nsp" in capsys.readouterr().err


@pytest.mark.parametrize("extra, says", [
    (["--chunk-mb", "nan"], "chunk_mb must be a finite number > 0, got nan"), (["--chunk_mb", "inf"], "chunk_mb must"),
    (["--masking_config.mask_token_fraction", "nan"], "masking_config.mask_token_fraction must be in [0, 1], got nan"),
    (["--seed", "-1", "--masking", "static"], "seed must be"), (["--masking-config.random-token-fraction", "-0.1"], "-0.1"),
    (["--masking_config.mask_prob", "1.5"], "mask_prob must be in (0, 1), got 1.5"),
    (["--masking_config.mask_prob", "0"], "mask_prob must"), (["--max_length", "4"], "max_length must be in [8, 65535]"),
    (["--eval-fraction", "nan"], "eval_fraction must"), (["--eval-documents", "1"], "eval_documents 1"),
    (["--masking_config.max_predictions", "0"], "masking_config.max_predictions must be at least 1, got 0"),
    (["--num-shards", "0"], "num_shards must be at least 1, got 0"), (["--workers", "0"], "workers must be")])
def test_bad_prepare_options_are_one_line_and_leave_nothing(minilm, small_corpus, tmp_path, capsys, extra, says):
    out = tmp_path / "o"
    assert main(["prepare", "--model", str(minilm), "--input", str(small_corpus), "--out", str(out),
                 "--no-progress", *extra]) == 1
    err = capsys.readouterr().err
    assert err.startswith("bertkit prepare: error:") and says in err and "Traceback" not in err, err
    assert not out.exists()
