"""Options generated from the config dataclasses (`bertkit.cliconfig`): one name for the flag, the
YAML key and the attribute; help from the field docs; Literal choices; "did you mean" on typos."""
from __future__ import annotations

import argparse
import dataclasses
from typing import Annotated, Literal

import pytest

from bertkit.cli import build_parser, main
from bertkit.cliconfig import POSITIONAL, add_options, field_docs, given, suggest_unknown
from bertkit.commands.finetune import finetune_config
from bertkit.finetune.config import FinetuneConfig


def finetune_parser() -> argparse.ArgumentParser:
    parser = build_parser(only="finetune")
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["finetune"]


def test_help_text_is_the_field_docstring(capsys):
    docs = field_docs(FinetuneConfig)
    assert docs["clip_norm"] == "Global gradient-norm clipping (0 = off)."
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in ("clip_norm", "eval_batch_size", "probe_pooling", "windows"):
        assert docs[name] in text, name


def test_literal_choices_are_enforced_with_a_suggestion(capsys):
    assert finetune_parser().parse_args(["--optimizer", "lamb"]).optimizer == "lamb"
    with pytest.raises(SystemExit) as e:
        finetune_parser().parse_args(["--optimizer", "lamm"])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert "is not one of adamw, adamw_google, lamb" in err and "did you mean 'lamb'?" in err


def test_unknown_option_gets_did_you_mean(capsys):
    with pytest.raises(SystemExit) as e:
        main(["finetune", "--model", "m", "--clipnorm", "0.5"])
    assert e.value.code == 1
    lines = [l for l in capsys.readouterr().err.splitlines() if "error:" in l]
    assert lines == ["bertkit finetune: error: unrecognized arguments: --clipnorm (did you mean --clip_norm?)"]


def test_every_finetune_field_is_reachable_from_the_cli(tmp_path):
    """Each field under its own name (YAML key = flag = attribute), and under the kebab spelling."""
    parser = finetune_parser()
    for f in dataclasses.fields(FinetuneConfig):
        flag = f"--{f.name}"
        assert flag in parser._option_string_actions, flag
        if "_" in f.name:
            assert f"--{f.name.replace('_', '-')}" in parser._option_string_actions
    args = parser.parse_args(["--model", "m", "--clip_norm", "0.25", "--log-every", "7", "--eval_batch_size", "8",
                              "--no-packed", "--skip-bad-rows", "--format", "jsonl", "--no-progress"])
    assert given(args, FinetuneConfig) == {"model": "m", "clip_norm": 0.25, "log_every": 7, "eval_batch_size": 8,
                                          "packed": False, "skip_bad_rows": True, "format": "jsonl",
                                          "progress": False}
    cfg = finetune_config(args)
    assert (cfg.clip_norm, cfg.log_every, cfg.eval_batch_size, cfg.packed, cfg.skip_bad_rows) == (0.25, 7, 8, False,
                                                                                                   True)


def test_yaml_key_is_the_flag_name_and_options_override_it(tmp_path):
    config = tmp_path / "ft.yaml"
    config.write_text("model: m\nclip_norm: 0.5\neval_batch_size: 16\nlr: 1.0e-4\nthreads: 1\n")
    parser = finetune_parser()
    cfg = finetune_config(parser.parse_args([str(config), "--eval_batch_size", "4"]))
    assert (cfg.clip_norm, cfg.eval_batch_size, cfg.lr, cfg.threads) == (0.5, 4, 1e-4, 1)
    config.write_text("model: m\nclip_nrom: 0.5\n")
    with pytest.raises(Exception, match="did you mean 'clip_norm'"):
        finetune_config(parser.parse_args([str(config)]))
    config.write_text("model: m\noptimizer: lamm\n")
    with pytest.raises(Exception, match="did you mean 'lamb'"):
        finetune_config(parser.parse_args([str(config)]))


@dataclasses.dataclass
class Small:
    mode: Literal["a", "b"] = "a"
    """How to run."""
    size: int | None = None
    on: bool = True


def test_generator_on_a_small_dataclass(capsys):
    p = argparse.ArgumentParser(prog="small")
    add_options(p, Small)
    suggest_unknown(p)
    assert given(p.parse_args([]), Small) == {}
    assert given(p.parse_args(["--mode", "b", "--size", "3", "--no-on"]), Small) == {"mode": "b", "size": 3,
                                                                                      "on": False}
    assert p.format_help().count("How to run.") == 1
    with pytest.raises(SystemExit):
        p.parse_args(["--sise", "3"])
    assert "did you mean --size?" in capsys.readouterr().err


@dataclasses.dataclass(kw_only=True)
class Io:
    text: Annotated[str, POSITIONAL]
    """The text."""
    more: Annotated[tuple[str, ...], POSITIONAL] = ()
    """More texts."""
    model: str
    """A folder."""
    inputs: tuple[str, ...]
    """Files."""
    out: str | None = None
    """Where to write."""


def test_required_many_and_positional_fields(capsys):
    """A field without a default is a required option (or `required=` names it), `tuple[str, ...]` takes one
    or more values, `Annotated[str, POSITIONAL]` is an argument kept as typed (no YAML reading); a missing one
    is argparse's one line naming it."""
    from bertkit.cli import Parser

    p = Parser(prog="bertkit io")
    add_options(p, Io, defaults=True)
    args = p.parse_args(["'quoted'", "a", "b", "--model", "m", "--inputs", "x", "y"])
    assert (args.text, args.more, args.model, args.inputs, args.out) == ("'quoted'", ["a", "b"], "m", ["x", "y"], None)
    assert p.parse_args(["t", "--model", "m", "--inputs", "x"]).more == ()
    for argv, missing in (([], "text, --model, --inputs"), (["t", "--inputs", "x"], "--model")):
        with pytest.raises(SystemExit) as e:
            p.parse_args(argv)
        assert e.value.code == 1
        assert capsys.readouterr().err == f"bertkit io: error: the following arguments are required: {missing}\n"
    p = Parser(prog="bertkit io")
    add_options(p, Io, names=("out",), required=("out",))
    with pytest.raises(SystemExit):
        p.parse_args([])
    assert capsys.readouterr().err.endswith("required: --out\n")


def test_skip_bad_rows_is_one_declaration_with_generated_flags():
    """skip_bad_rows is declared once (tasks.SkipBadRows) for fine-tuning, score and embed-eval, and evaluate's
    flag is generated from it (both spellings)."""
    from bertkit.embed_eval import EmbedEvalOptions
    from bertkit.tasks import SkipBadRows
    from bertkit.tasks.metrics import ScoreOptions

    for cls in (FinetuneConfig, ScoreOptions, EmbedEvalOptions):
        assert issubclass(cls, SkipBadRows) and field_docs(cls)["skip_bad_rows"] == field_docs(SkipBadRows)["skip_bad_rows"]
    for flag in ("--skip-bad-rows", "--skip_bad_rows"):
        assert build_parser("evaluate").parse_args(["evaluate", "--model", "m", "--data", "d", flag]).skip_bad_rows
    assert not build_parser("evaluate").parse_args(["evaluate", "--model", "m", "--data", "d"]).skip_bad_rows


def test_a_renamed_key_is_a_one_line_error_naming_the_new_one():
    """One name per setting: `threads` everywhere, `optimizer` in fine-tuning and pre-training. An
    old spelling (YAML files, scripts) is never taken silently: one line says what replaced it; a
    typo of either still gets 'did you mean'."""
    from bertkit.finetune.config import FinetuneConfig
    from bertkit.runconfig import PretrainConfig, RunConfigError, from_dict

    with pytest.raises(RunConfigError, match="old.yaml: train.num_threads is now train.threads"):
        from_dict(PretrainConfig, {"train": {"num_threads": 3}}, "old.yaml")
    with pytest.raises(RunConfigError, match="optim.name is now optim.optimizer"):
        from_dict(PretrainConfig, {"optim": {"name": "lamb"}}, "old.yaml")
    with pytest.raises(RunConfigError, match="max_seq_length is now max_length"):
        from_dict(FinetuneConfig, {"max_seq_length": 64}, "old.yaml")
    assert from_dict(PretrainConfig, {"optim": {"optimizer": "lamb"}}, "new.yaml").optim.optimizer == "lamb"
    assert from_dict(PretrainConfig, {"train": {"threads": 2}}, "new.yaml").train.threads == 2
    with pytest.raises(RunConfigError, match="did you mean 'train.threads'"):
        from_dict(PretrainConfig, {"train": {"thread": 2}}, "typo.yaml")


def test_pretrain_options_are_generated_from_its_config_sections(tmp_path, capsys):
    """`bertkit pretrain` options come from PretrainConfig: --section.key (and the kebab spelling),
    both `--k v` and `--k=v`, field docs in --help, the old train.num_threads an error naming the new, and the
    YAML file overridden only by what was typed."""
    import argparse

    from bertkit.cliconfig import add_options, given, suggest_unknown
    from bertkit.runconfig import PretrainConfig, load_config

    p = argparse.ArgumentParser(prog="bertkit pretrain")
    p.add_argument("config", nargs="?")
    add_options(p, PretrainConfig)
    suggest_unknown(p)
    help_text = p.format_help()
    assert "--train.batch_size" in help_text and "--optim.lr" in help_text and "Wall-time budget" in help_text
    yml = tmp_path / "c.yaml"
    yml.write_text("model:\n  preset: tiny\ntrain:\n  batch_size: 8\n  max_steps: 5\noptim:\n  lr: 0.001\n")
    with pytest.raises(SystemExit):
        p.parse_args([str(yml), "--train.num_threads=3"])
    assert "--train.num_threads is now --train.threads" in capsys.readouterr().err
    args = p.parse_args([str(yml), "--train.batch-size", "16", "--optim.betas=[0.9, 0.98]", "--train.threads=3",
                         "--no-train.nsp", "--train.progress=false", "--resume=true"])
    values = given(args, PretrainConfig)
    assert values == {"resume": True, "train": {"batch_size": 16, "threads": 3, "nsp": False, "progress": False},
                      "optim": {"betas": (0.9, 0.98)}}
    with pytest.raises(SystemExit):
        p.parse_args(["--train.nsp=maybe"])
    assert "--train.nsp: expected true or false" in capsys.readouterr().err
    cfg = load_config(PretrainConfig, args.config, values=values)
    assert (cfg.model.preset, cfg.train.batch_size, cfg.train.max_steps, cfg.train.threads) == ("tiny", 16, 5, 3)
    assert cfg.optim.lr == 0.001 and cfg.optim.betas == (0.9, 0.98) and cfg.train.nsp is False


def test_ablate_grid_options_come_from_its_config(capsys):
    """`bertkit ablate` grid-level options are AblateConfig fields (same names as the YAML keys);
    --arms stays a selection and never replaces the grid's arms."""
    import argparse

    from bertkit import ablate

    from bertkit.ablate import config as ablate_config
    from bertkit.cliconfig import given
    from bertkit.commands.ablate import GRID_OPTIONS, setup_ablate

    p = argparse.ArgumentParser(prog="bertkit ablate")
    setup_ablate(p)
    args = p.parse_args(["small.yaml", "--eval-documents", "7", "--keep_models", "--arms", "base",
                         "--launcher", "torchrun"])
    values = {k: v for k, v in given(args, ablate_config.AblateConfig).items() if k in GRID_OPTIONS}
    assert values == {"eval_documents": 7, "keep_models": True} and args.launcher == "torchrun"
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    cfg = ablate_config.load_ablate_config(repo / "configs" / "ablate" / "small.yaml", values=values)
    assert cfg.eval_documents == 7 and cfg.keep_models and len(cfg.arms) > 1
    with pytest.raises(SystemExit):
        p.parse_args(["--eval-document", "7"])
    assert "did you mean --eval" in capsys.readouterr().err


def test_every_command_takes_both_spellings_of_an_option():
    """`--a_b` and `--a-b` are one option in every command, generated from a dataclass or written by
    hand (probe's --train-limit, prepare's --num-shards); a value after `--` is left alone."""
    from bertkit.cli import build_parser

    args = build_parser("probe").parse_args(["probe", "--model", "m", "--task", "sst2", "--train_limit", "5",
                                             "--max-iter=3", "--dev_limit=7"])
    assert (args.train_limit, args.max_iter, args.dev_limit) == (5, 3, 7)
    args = build_parser("prepare").parse_args(["prepare", "--model", "m", "--input", "a", "--out", "o",
                                               "--num_shards", "2", "--shard-index=1", "--no_progress"])
    assert (args.num_shards, args.shard_index, args.progress) == (2, 1, False)
    args = build_parser("data").parse_args(["data", "nsp-shortcut", "f.txt", "--model", "m", "--no_progress"])
    assert (args.files, args.progress) == (["f.txt"], False)
    args = build_parser("tokenizer").parse_args(["tokenizer", "train", "a.txt", "--out", "o", "--vocab_size", "100",
                                                 "--min_frequency=1"])
    assert (args.vocab_size, args.min_frequency) == (100, 1)
    args = build_parser("predict").parse_args(["predict", "--model", "m", "--", "--batch_size"])
    assert args.input == "--batch_size"


def test_export_options_are_export_options_fields(capsys):
    """`bertkit export onnx`: one flag per ExportOptions field (`--max_abs_diff`, also `--max-abs-diff`);
    a range on a field is a one-line error naming it (no export run)."""
    from bertkit.infer.export import ExportOptions

    args = build_parser("export").parse_args(["export", "onnx", "--model", "m", "--out", "o.onnx", "--optimize",
                                              "--int8", "--max-abs-diff", "0.01", "--min_cosine=0.99"])
    assert given(args, ExportOptions) == {"optimize": True, "int8": True, "max_abs_diff": 0.01, "min_cosine": 0.99}
    assert main(["export", "onnx", "--model", "m", "--out", "o.onnx", "--min_cosine", "2"]) == 1
    assert capsys.readouterr().err == "bertkit export: error: min_cosine must be in [0, 1], got 2.0\n"


@pytest.mark.parametrize("command, dash, underscore, field, value, bad, error", [
    (["tokenizer", "train", "a.txt", "--out", "o"], "--vocab-size", "--vocab_size", "vocab_size", 100,
     ["--vocab-size", "5"], "vocab_size must be at least 10, got 5"),
    (["tokenizer", "stats", "a.txt", "--model", "m"], "--max-sentences", "--max_sentences", "max_sentences", 100,
     ["--max-sentences", "0"], "max_sentences must be at least 1, got 0"),
    (["data", "stats", "d"], "--mask-mode", "--mask_mode", "mask_mode", "span",
     ["--sample", "-1"], "sample must be a finite number >= 0, got -1"),
    (["data", "show", "d"], "-n", "-n", "n", 3, ["--epoch", "-1"], "epoch must be a finite number >= 0, got -1"),
    (["inspect", "the cat", "--model", "m"], "--top-k", "--top_k", "top_k", 3,
     ["--steps", "513"], "steps must be 0 to 512, got 513"),
    (["convert", "ckpt", "--out", "o"], "--do-lower-case", "--do_lower_case", "do_lower_case", False,
     ["--do-lower-case", "maybe"], "argument --do_lower_case/--do-lower-case: expected true or false, got 'maybe'"),
    (["score", "--task", "sst2", "--predictions", "p", "--references", "r"], "--na-prob-thresh", "--na_prob_thresh",
     "na_prob_thresh", 0.5, ["--na-prob-thresh", "nan"], "na_prob_thresh must be a finite number, got nan"),
    (["tokenize", "t.txt", "--model", "m"], "--max-length", "--max_length", "max_length", 8,
     ["--max-length", "2"], "max_length must be at least 3 (room for [CLS] x [SEP]), got 2"),
    (["embed", "t.txt", "--model", "m"], "--batch-size", "--batch_size", "batch_size", 8,
     ["--batch-size", "0"], "batch_size must be at least 1, got 0"),
    (["fill-mask", "a [MASK]", "--model", "m"], "--top-k", "--top_k", "top_k", 3,
     ["--top-k", "0"], "top_k must be at least 1, got 0"),
])
def test_options_dataclass_commands_take_both_spellings_and_name_the_field(capsys, command, dash, underscore, field,
                                                                           value, bad, error):
    """The commands whose flags come from an options dataclass (TokenizerTrainOptions, TokenizerStatsOptions,
    DataStatsOptions, ShowOptions, InspectOptions, ConvertOptions, ScoreOptions, TokenizeOptions,
    EmbedOptions, fill-mask's PredictOptions.top_k): both spellings of a flag give the field, and a value out
    of its range is one line naming the field, before any file is read."""
    parser = build_parser(command[0])
    for flag in (dash, underscore, f"{underscore}={value}"):
        extra = [flag] if "=" in flag else [flag, str(value).lower()]
        assert getattr(parser.parse_args(command + extra), field) == value, flag
    try:
        code = main(command + bad)
    except SystemExit as e:                             # a value argparse refuses (convert's true|false)
        code = e.code
    assert code == 1 and capsys.readouterr().err == f"bertkit {command[0]}: error: {error}\n"
