"""`bertkit finetune --seeds`: every seed trained into OUT/seed-N, the spread over seeds reported,
the best seed on dev kept as OUT's model (loads in predict / evaluate, evaluate shows the spread),
a rerun skipping finished seeds and restarting an interrupted one, collapse detection per task."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.finetune import FinetuneConfig
from bertkit.finetune.seeds import collapse_rule, finetune_seeds, is_collapsed, parse_seeds, summarize
from bertkit.tasks import get_task
from test_finetune import sst_dir, tiny_model  # noqa: F401  (fixtures)

pytestmark = pytest.mark.usefixtures("one_thread")    # conftest: tiny models, one thread

ARGS = ["--task", "sst2", "--threads", "1", "--max-length", "32", "--batch-size", "16", "--lr", "5e-3", "--epochs", "2",
        "--no-progress", "--log_every", "5"]      # here: seeds 0 and 1 collapse, seed 2 learns the task


def cfg(**kw) -> FinetuneConfig:
    base = dict(task="sst2", batch_size=16, lr=2e-3, epochs=1, progress=False, max_length=32, log_every=5)
    return FinetuneConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def three_seeds(tiny_model, sst_dir, tmp_path_factory):
    """`bertkit finetune --seeds 0,1,2` once for the module: (out folder, stdout). (--threads 1: the
    module fixture runs before the per-test one_thread.)"""
    out = tmp_path_factory.mktemp("seeds") / "run"
    import contextlib
    import io

    import torch
    buf, threads = io.StringIO(), torch.get_num_threads()
    with contextlib.redirect_stdout(buf):
        rc = main(["finetune", "--data", str(sst_dir), "--model", str(tiny_model), "--out", str(out), *ARGS,
                   "--seeds", "0,1,2"])
    torch.set_num_threads(threads)
    assert rc == 0
    return out, buf.getvalue()


def test_three_seeds_summary_and_the_chosen_seed(three_seeds):
    out, printed = three_seeds
    summary = json.loads((out / "seeds.json").read_text())
    assert {"task", "main_metric", "seeds", "chosen_seed", "chosen_by", "chosen_dev", "metrics", "collapse", "runs",
            "dev_file", "wall_time_s", "seed_time_s"} <= set(summary)
    assert summary["seeds"] == [0, 1, 2] and summary["main_metric"] == "accuracy"
    scores = [r["dev"]["accuracy"] for r in summary["runs"]]
    stats = summary["metrics"]["accuracy"]
    assert stats["n"] == 3 and stats["min"] == min(scores) and stats["max"] == max(scores)
    assert stats["mean"] == pytest.approx(sum(scores) / 3)
    mean = sum(scores) / 3
    assert stats["std"] == pytest.approx(math.sqrt(sum((s - mean) ** 2 for s in scores) / 2))      # n - 1
    assert summary["chosen_seed"] == summary["seeds"][scores.index(max(scores))]      # the first of the best
    assert "optimistic" in summary["chosen_by"]
    assert summary["collapse"]["rule"] == "every dev prediction one class"
    assert summary["collapse"]["seeds"] == [r["seed"] for r in summary["runs"] if r["collapsed"]]
    for r in summary["runs"]:                               # collapsed = one class in the seed's dev predictions
        rows = (out / r["folder"] / "dev_predictions.jsonl").read_text().splitlines()
        assert r["collapsed"] == (len({json.loads(x)["prediction"] for x in rows}) == 1)
    for seed in (0, 1, 2):                                  # each seed a complete run of its own, JSONL metrics
        folder = out / f"seed-{seed}"
        assert json.loads((folder / "metrics.json").read_text())["dev"]["accuracy"] == scores[seed]
        assert (folder / "metrics.jsonl").read_text().count("\n") >= 2
        assert "seed: %d" % seed in (folder / "finetune.yaml").read_text()
    assert len((out / "seeds.jsonl").read_text().splitlines()) == 3
    chosen = out / f"seed-{summary['chosen_seed']}"
    for name in ("config.json", "model.safetensors", "vocab.txt", "metrics.json", "dev_predictions.jsonl"):
        assert (out / name).read_bytes() == (chosen / name).read_bytes(), name
    card = json.loads((out / "run_card.json").read_text())
    assert card["seeds"]["chosen_seed"] == summary["chosen_seed"] and "runs" not in card["seeds"]
    md = (out / "run_card.md").read_text()
    assert "## Seeds" in md and f"seed {summary['chosen_seed']}" in md and "optimistic" in md
    lines = printed.splitlines()                            # the printed table
    assert lines[0].startswith("sst2: 3 seeds (0, 1, 2)")
    row = next(ln for ln in lines if ln.split()[:1] == ["accuracy"])
    assert row.split()[1:5] == [f"{stats[k]:.4f}" for k in ("mean", "std", "min", "max")]
    assert row.endswith(f"{len(summary['collapse']['seeds'])} of 3")
    assert any(f"chosen: seed {summary['chosen_seed']}" in ln and "optimistic" in ln for ln in lines)


def test_the_folder_loads_in_predict_and_evaluate_shows_the_spread(three_seeds, sst_dir, tmp_path, capsys):
    out, _ = three_seeds
    summary = json.loads((out / "seeds.json").read_text())
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"text": "the film was great"}\n', encoding="utf-8")
    capsys.readouterr()
    assert main(["predict", "--model", str(out), str(inp)]) == 0
    mine = json.loads(capsys.readouterr().out)
    assert main(["predict", "--model", str(out / f"seed-{summary['chosen_seed']}"), str(inp)]) == 0
    assert json.loads(capsys.readouterr().out) == mine                 # OUT is the chosen seed's model
    assert main(["evaluate", "--model", str(out), "--data", str(sst_dir / "dev.tsv"), "--json"]) == 0
    ev = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert ev["accuracy"] == pytest.approx(summary["chosen_dev"]["accuracy"])
    assert ev["seeds"]["metrics"]["accuracy"] == summary["metrics"]["accuracy"]
    assert ev["seeds"]["chosen_seed"] == summary["chosen_seed"]
    assert main(["evaluate", "--model", str(out), "--data", str(sst_dir / "dev.tsv")]) == 0
    text = capsys.readouterr().out
    acc = next(ln for ln in text.splitlines() if ln.split()[:1] == ["accuracy"])
    assert "seeds on dev: mean" in acc and f"{summary['metrics']['accuracy']['mean']:.4f}" in acc
    assert f"this model is seed {summary['chosen_seed']} of 3" in text and "optimistic" in text


def test_a_rerun_skips_finished_seeds_and_restarts_an_interrupted_one(tiny_model, sst_dir, tmp_path, monkeypatch):
    import bertkit.finetune as ft
    from bertkit.outdir import staging_path

    out = tmp_path / "run"
    base = cfg(data=str(sst_dir), model=str(tiny_model), out=str(out))
    first = finetune_seeds(base, [0, 1])
    trained = []
    real = ft.finetune

    def counting(c, command=""):
        trained.append(c.seed)
        return real(c, command)
    monkeypatch.setattr(ft, "finetune", counting)
    # seed 2 killed mid-run: its staging folder holds a marked best-so-far checkpoint of a dead writer
    stale = staging_path(out / "seed-2")
    stale.mkdir()
    (stale / "config.json").write_text(json.dumps({"bertkit_incomplete": "fine-tuning in progress"}))
    (stale / ".bertkit-writer").write_text("999999999\n")
    again = finetune_seeds(base, [0, 1, 2])
    assert trained == [2] and not stale.exists()
    assert [r["skipped"] for r in again["runs"]] == [True, True, False]
    assert again["runs"][:2] == [{**r, "skipped": True} for r in first["runs"]]
    assert finetune_seeds(base, [2, 0]) and trained == [2]             # all finished: nothing trained
    assert json.loads((out / "seeds.json").read_text())["seeds"] == [2, 0]
    assert len((out / "seeds.jsonl").read_text().splitlines()) == 2 + 3 + 2
    # a finished seed trained with other settings is not silently reused
    with pytest.raises(BertkitError, match=r"seed-0: a finished seed fine-tuned with lr 0.002, this run asks 0.001"):
        finetune_seeds(cfg(data=str(sst_dir), model=str(tiny_model), out=str(out), lr=1e-3), [0, 3])
    with pytest.raises(BertkitError, match=r"max_length 32, this run asks 64"):     # None: the task's, within 64 positions
        finetune_seeds(cfg(data=str(sst_dir), model=str(tiny_model), out=str(out), max_length=None), [0])
    assert trained == [2] and not (out / "seed-3").exists()


def test_collapse_rules_per_task():
    sst, stsb, ner, squad, squad2, swag = (get_task(n) for n in ("sst2", "stsb", "conll2003", "squad", "squad2",
                                                                 "swag"))
    assert is_collapsed(sst, ["1", "1", "1"]) and not is_collapsed(sst, ["1", "0", "1"])
    assert is_collapsed(stsb, [2.5, 2.5001, 2.4999]) and not is_collapsed(stsb, [2.5, 3.1, 0.4])
    assert is_collapsed(ner, [["O", "O"], ["O"]]) and is_collapsed(ner, [["B-PER"], ["B-PER", "B-PER"]])
    assert not is_collapsed(ner, [["O", "B-PER"], ["O"]])
    assert is_collapsed(squad2, ["", "", ""]) and not is_collapsed(squad2, ["", "paris", ""])
    assert is_collapsed(swag, [2, 2, 2]) and not is_collapsed(swag, [2, 0, 2])
    rule, why = collapse_rule(squad)
    assert rule is None and "SQuAD v1.1" in why                       # left out, with the reason
    assert all(collapse_rule(t)[0] for t in (sst, stsb, ner, squad2, swag))


def test_summary_statistics_with_collapsed_and_undefined_scores():
    task = get_task("cola")
    runs = [{"seed": s, "dev": {"mcc": v, "accuracy": a}, "collapsed": c, "wall_time_s": 1.0}
            for s, v, a, c in ((3, 0.0, 0.69, True), (4, 0.41, 0.78, False), (5, float("nan"), 0.69, True),
                               (6, 0.41, 0.79, False))]
    summary = summarize(task, runs, "dev.tsv", 4.0)
    assert summary["chosen_seed"] == 4                               # first of equal; NaN never wins
    assert summary["metrics"]["mcc"] == {"mean": pytest.approx(0.82 / 3), "std": pytest.approx(0.2367, abs=1e-4),
                                         "min": 0.0, "max": 0.41, "n": 3}
    assert summary["collapse"]["seeds"] == [3, 5]


@pytest.mark.parametrize("text, match", [("a,b", "'a' is not an integer"), ("0,1,0", "seed 0 is given twice"),
                                         ("", "no seeds"), (" , ", "no seeds"), ("1,-1", "integer in"),
                                         ("2.5", "'2.5' is not an integer")])
def test_parse_seeds(text, match):
    with pytest.raises(BertkitError, match=match):
        parse_seeds(text)
    assert parse_seeds(" 4, 0,2 ") == [4, 0, 2]
