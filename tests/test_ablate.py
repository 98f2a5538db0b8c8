"""`bertkit ablate`: a micro grid end to end (tiny model, a few updates, tiny synthetic task files),
resuming, failing arms as rows, sharding, the statistics and the paper note's contract test."""
from __future__ import annotations

import json
import math
import random
import re
import shutil
from importlib import resources
from pathlib import Path

import pytest

from bertkit import ablate

from bertkit.ablate import config as ablate_config
from bertkit.ablate.report import betainc, compare, mean_std, welch_t_test, write_report
from bertkit.errors import BertkitError

REPO = Path(__file__).resolve().parents[1]


def write_tasks(root: Path) -> None:
    """SST-2-style sentences whose label is carried by one word, and CoNLL-style tagged names."""
    r = random.Random(0)
    pos, neg = "good great fine lovely superb".split(), "bad awful poor terrible dull".split()
    fill = "the movie was a story with some actors and it felt".split()

    def sentence(label: int) -> str:
        words = [r.choice(fill) for _ in range(r.randint(3, 8))]
        words.insert(r.randrange(len(words) + 1), r.choice(pos if label else neg))
        return " ".join(words)

    (root / "sst").mkdir(parents=True)
    for name, n in (("train.tsv", 48), ("dev.tsv", 24)):
        rows = ["sentence\tlabel"] + [f"{sentence(lab)}\t{lab}" for lab in (i % 2 for i in range(n))]
        (root / "sst" / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    tags = {"john": "B-PER", "mary": "B-PER", "paris": "B-LOC", "london": "B-LOC"}
    (root / "ner").mkdir(parents=True)
    for name, n in (("train.txt", 32), ("valid.txt", 16)):
        lines = []
        for _ in range(n):
            words = [r.choice(fill) for _ in range(r.randint(3, 6))]
            words.insert(r.randrange(len(words) + 1), r.choice(list(tags)))
            lines += [f"{w} NN O {tags.get(w, 'O')}" for w in words] + [""]
        (root / "ner" / name).write_text("\n".join(lines) + "\n", encoding="utf-8")


MICRO = """\
# a micro grid: seconds, not minutes
out: {out}
data_dir: {data}
corpus: [{corpus}]
eval_documents: 6
tokenizer: {{vocab_size: 500}}
prepare: {{max_length: 48}}
pretrain:
  model: {{preset: tiny, num_layers: 1, hidden_size: 32, num_heads: 2, intermediate_size: 64}}
  train: {{batch_size: 8, log_every: 1, eval_every: 0, checkpoint_every: 0}}
  data: {{eval_instances: 16}}
  optim: {{lr: 1.0e-3}}
finetune: {{max_length: 32, batch_size: 8, epochs: 1, lr: 1.0e-3}}
tasks:
  sst2: {{data: sst}}
  conll2003: {{data: ner}}
seeds: [0, 1]
budget: {{match: tokens, steps: 3}}
mlm_eval_instances: 16
threads: 1
arms:
  - {{name: base, setting: "the base recipe"}}
  - {{name: no_pretraining, pretrained: false}}
  - {{name: bad, pretrain: {{train: {{no_such_key: 1}}}}}}
  - {{name: later, pretrain: {{train: {{nsp: false}}}}}}
  - {{name: probe_later, model_from: later, finetune: {{freeze: true, probe_features: last}}}}
  - {{name: early, model_from: base, checkpoint: 1}}
  - {{name: ddp, pretrain: {{train: {{seed: 1}}}}}}
"""


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("ablate")
    write_tasks(root / "data")
    corpus = Path(str(resources.files("bertkit") / "sample" / "inaugural.txt.gz"))
    path = root / "micro.yaml"
    path.write_text(MICRO.format(out=root / "out", data=root / "data", corpus=corpus), encoding="utf-8")
    cfg = ablate_config.load_ablate_config(path)
    summary = ablate.run_grid(cfg, ablate_config.select_arms(cfg, ["base", "no_pretraining", "bad", "early"]))
    write_report(cfg)
    return path, summary


def rows_of(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines() if x]


def test_micro_grid_end_to_end(grid):
    path, summary = grid
    out = path.parent / "out"
    assert summary["ran"] == ["base", "no_pretraining", "bad", "early"] and summary["failed"] == ["bad"]
    rows = rows_of(out)
    ok = [r for r in rows if r["status"] == "ok"]
    assert sorted({(r["arm"], r["task"], r["seed"]) for r in ok}) == sorted(
        (a, t, s) for a in ("base", "no_pretraining", "early") for t in ("sst2", "conll2003") for s in (0, 1))
    assert all(0.0 <= r["value"] <= 1.0 for r in ok)
    assert {r["metric"] for r in ok if r["task"] == "sst2"} == {"accuracy"}
    base = json.loads((out / "arms" / "base" / "arm.json").read_text())
    assert base["status"] == "done" and base["pretrain"]["updates"] == 3 and base["pretrain"]["tokens"] > 0
    assert 0.0 <= base["mlm"]["accuracy"] <= 1.0 and base["mlm"]["instances"] == 16
    assert (out / "arms" / "base" / "pretrain" / "run_card.md").is_file()
    assert (out / "arms" / "base" / "finetune" / "sst2" / "seed1" / "run_card.md").is_file()
    assert not list((out / "arms" / "base" / "finetune").rglob("*.safetensors"))   # keep_models: false
    # the steps axis as the paper's Figure 5: the base run read after 1 of its 3 updates
    early = json.loads((out / "arms" / "early" / "arm.json").read_text())
    assert early["model"].endswith("base/pretrain/at-step-1") and early["pretrain"]["updates"] == 1
    assert 0 < early["pretrain"]["tokens"] < base["pretrain"]["tokens"]
    # its held-out MLM is that of the model at update 1, not the base's final model (a 3-update model
    # after 1 update has a clearly higher held-out loss)
    assert early["mlm"]["loss"] != base["mlm"]["loss"] and early["mlm"]["loss"] > base["mlm"]["loss"]
    assert not (out / "arms" / "base" / "pretrain" / "checkpoints").exists()
    nopre = json.loads((out / "arms" / "no_pretraining" / "arm.json").read_text())
    assert nopre["init"] == "random" and nopre["pretrain"]["tokens"] == 0
    assert not (out / "arms" / "no_pretraining" / "pretrain").exists()
    # the bad arm is a row with its one-line error, and the arms after it still ran
    bad = [r for r in rows if r["arm"] == "bad"]
    assert len(bad) == 1 and bad[0]["status"] == "failed" and "unknown key 'train.no_such_key'" in bad[0]["error"]
    assert "\n" not in bad[0]["error"]
    assert (out / "arms" / "bad" / "error.txt").is_file()
    report = (out / "REPORT.md").read_text()
    assert ("| arm | setting | pretrain tokens | pretrain FLOPs (updates) | wall: pretrain / arm | MLM acc at [MASK] "
            "| Δ at [MASK] vs base [95%] | MLM acc, all targets | sst2 accuracy | Δ sst2 [95% CI] |") in report
    main_table = report.split("How to read it")[0]
    lines = {ln.split(" | ")[0].strip("| "): ln for ln in main_table.splitlines() if ln.startswith("| ")}
    assert "base" in lines["base"] and " ± " in lines["base"] and "| done |" in lines["base"]
    assert re.search(r"\| [+-]\d\.\d{3} \[[+-]\d\.\d{3}, [+-]\d\.\d{3}\]", lines["no_pretraining"])
    assert "failed: " in lines["bad"] and "not run" in lines["later"]
    assert "commit " in report and "CPU " in report and "Welch" in report
    # what ran, from the run cards, and the paper note's checklist answered from them
    trained = report.split("## As trained")[1].split("## Reproduction checklist")[0]
    assert "| base | MLM + NSP | bidirectional |" in trained and "token 15%, 80/10/10" in trained
    assert "| no_pretraining | — |" in trained and "| bad |" not in trained
    checklist = report.split("## Reproduction checklist")[1]
    assert "`[CLS] " in checklist and "segment ids 0 x" in checklist and "random init no_pretraining" in checklist
    assert (out / "plots" / "downstream.png").stat().st_size > 0 and (out / "plots" / "mlm_accuracy.png").is_file()
    # the shared inputs were made once: one tokenizer, one prepared data set, a document-level split
    assert len(list((out / "shared" / "data").iterdir())) == 1
    split = json.loads((out / "shared" / "corpus" / "split.json").read_text())
    held = (out / "shared" / "corpus" / "heldout.txt").read_text().split("\n\n")
    train = (out / "shared" / "corpus" / "train.txt").read_text().split("\n\n")
    assert split["heldout_documents"] == 6 and not {d.strip() for d in held} & {d.strip() for d in train}


def test_rerun_skips_finished_arms_and_reuses_runs(grid):
    path, _ = grid
    out = path.parent / "out"
    card = out / "arms" / "base" / "pretrain" / "run_card.json"
    before = card.stat().st_mtime_ns
    cfg = ablate_config.load_ablate_config(path)
    summary = ablate.run_grid(cfg, ablate_config.select_arms(cfg, ["base", "no_pretraining", "bad", "early"]))
    assert summary["skipped"] == ["base", "no_pretraining", "early"] and summary["ran"] == ["bad"]
    assert card.stat().st_mtime_ns == before
    # a third seed changes the plan: the arm runs again, but only the new fine-tuning runs are new
    cfg.seeds = [0, 1, 2]
    seed0 = out / "arms" / "base" / "finetune" / "sst2" / "seed0" / "metrics.json"
    t0 = seed0.stat().st_mtime_ns
    summary = ablate.run_grid(cfg, ablate_config.select_arms(cfg, ["base"]))
    write_report(cfg)                             # collects OUT/results.jsonl (bertkit ablate does this next)
    assert summary["ran"] == ["base"] and card.stat().st_mtime_ns == before and seed0.stat().st_mtime_ns == t0
    assert {r["seed"] for r in rows_of(out) if r["arm"] == "base"} == {0, 1, 2}
    # and a finished arm whose pre-training settings changed is pre-trained again, not mixed: the
    # earlier run is kept aside (on a copy of the grid, which the other tests share)
    copy = out.parent / "out_changed"
    shutil.copytree(out, copy)
    cfg.out, cfg.pretrain["optim"]["lr"] = str(copy), 5e-4
    state = ablate.run_arm(cfg, cfg.arms[0], ablate.Shared(cfg), ablate.RunOptions())
    assert state["status"] == "done", state["error"]
    kept = list((copy / "arms" / "base").glob("pretrain.replaced-*"))
    assert len(kept) == 1 and (kept[0] / "final" / "config.json").is_file()
    assert "lr: 0.0005" in (copy / "arms" / "base" / "pretrain" / "config.yaml").read_text()
    # a pre-training the grid did not make (no marker of its own) is refused
    (copy / "arms" / "base" / "pretrain" / "ablate_key.json").unlink()
    cfg.pretrain["optim"]["lr"] = 4e-4
    state = ablate.run_arm(cfg, cfg.arms[0], ablate.Shared(cfg), ablate.RunOptions())
    assert state["status"] == "failed" and "did not make" in state["error"]


def test_a_pretraining_stopped_by_a_signal_resumes_instead_of_counting_as_done(grid):
    """SIGTERM writes a run card and final/ too; the grid must continue that run, not fine-tune it."""
    path, _ = grid
    copy = path.parent / "out_signal"
    shutil.copytree(path.parent / "out", copy)
    cfg = ablate_config.load_ablate_config(path)
    cfg.out = str(copy)
    card_path = copy / "arms" / "base" / "pretrain" / "run_card.json"
    card = json.loads(card_path.read_text())
    card["stop_reason"] = "signal SIGTERM"
    card_path.write_text(json.dumps(card))
    arm = next(a for a in cfg.arms if a.name == "base")
    (copy / "arms" / "base" / "arm.json").unlink()
    log_path = copy / "arms" / "base" / "log.txt"
    old = log_path.read_text()
    state = ablate.run_arm(cfg, arm, ablate.Shared(cfg), ablate.RunOptions())
    assert state["status"] == "done", state["error"]
    new = log_path.read_text()[len(old):]                   # this run's lines (the log is appended to)
    assert "arm base: pre-training (" in new and "finished before; reusing" not in new
    assert json.loads(card_path.read_text())["stop_reason"] != "signal SIGTERM"


def test_a_pretraining_the_trainer_stops_on_a_signal_leaves_the_arm_interrupted(grid, monkeypatch):
    """The trainer catches SIGINT/SIGTERM, saves a checkpoint and returns its card: the arm must not go
    on to be scored and fine-tuned on the cut-short model (a GPU grid's stage deadline did that)."""
    import bertkit.train as train
    path, _ = grid
    copy = path.parent / "out_signal_live"
    shutil.copytree(path.parent / "out", copy)
    cfg = ablate_config.load_ablate_config(path)
    cfg.out, cfg.pretrain["optim"]["lr"] = str(copy), 3e-4        # new settings: the arm pre-trains again
    real = train.pretrain

    def stopped(pcfg, command=""):
        return {**real(pcfg, command=command), "stop_reason": "signal SIGINT"}
    monkeypatch.setattr(train, "pretrain", stopped)
    arm = next(a for a in cfg.arms if a.name == "base")
    with pytest.raises(KeyboardInterrupt):
        ablate.run_arm(cfg, arm, ablate.Shared(cfg), ablate.RunOptions())
    state = json.loads((copy / "arms" / "base" / "arm.json").read_text())
    assert state["status"] == "interrupted" and "mlm" not in state
    assert (copy / "arms" / "base" / "pretrain" / "checkpoints").is_dir()        # kept: a rerun resumes


def test_claims_leave_running_arms_to_their_process(grid, tmp_path):
    path, _ = grid
    cfg = ablate_config.load_ablate_config(path)
    d = path.parent / "out" / "arms" / "later"
    d.mkdir(parents=True, exist_ok=True)
    import os
    import socket
    (d / ".claim").write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
    summary = ablate.run_grid(cfg, ablate_config.select_arms(cfg, ["later"]))
    assert summary["elsewhere"] == ["later"] and summary["ran"] == []          # a live holder: left to it
    (d / ".claim").write_text(json.dumps({"host": socket.gethostname(), "pid": 2 ** 22 + 4321}))
    claim = ablate.grid._claim(d)                                                   # a dead holder: taken over
    assert claim is not None and json.loads(claim.read_text())["pid"] == os.getpid()
    assert ablate.grid._claim(d) is None                                            # and now held by us
    claim.unlink()


def test_jobs_share_the_arms(grid, capsys):
    """Two processes: a finished arm is skipped by both, each new arm runs once, the probe arm waits for
    the model it reads, and the report follows."""
    path, _ = grid
    from bertkit.cli import main
    out = path.parent / "out"
    assert main(["ablate", str(path), "--jobs", "2", "--arms", "base,later,probe_later"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["jobs"] == 2 and summary["exit_codes"] == [0, 0]
    assert set(summary["done"]) == {"base", "later", "probe_later"}
    for name in ("later", "probe_later"):
        assert not (out / "arms" / name / ".claim").exists()
    assert (out / "arms" / "later" / "log.txt").read_text().count("ablate: arm later: pre-training") == 1
    probe = json.loads((out / "arms" / "probe_later" / "arm.json").read_text())
    assert probe["pretrain"]["model_from"] == "later" and probe["model"].endswith("later/pretrain/final")
    report = (out / "REPORT.md").read_text()
    assert "| later |" in report and "| probe_later |" in report
    # the probe's numbers belong to the model it read: if that model is trained again, the probe is stale
    cfg = ablate_config.load_ablate_config(path)
    arms = {a.name: a for a in cfg.arms}
    assert ablate.finished(cfg, arms["later"]) and ablate.finished(cfg, arms["probe_later"])
    weights = next((out / "arms" / "later" / "pretrain" / "final").glob("*.safetensors"))
    import os
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10 ** 9))
    assert ablate.finished(cfg, arms["later"]) and not ablate.finished(cfg, arms["probe_later"])


@pytest.mark.slow
def test_torchrun_launcher_keeps_the_global_batch(grid, capsys):
    path, _ = grid
    from bertkit.cli import main
    out = path.parent / "out"
    assert main(["ablate", str(path), "--arms", "ddp", "--launcher", "torchrun", "--nproc", "2",
                 "--no-report"]) == 0
    state = json.loads((out / "arms" / "ddp" / "arm.json").read_text())
    assert state["status"] == "done", state.get("error")
    card = json.loads((out / "arms" / "ddp" / "pretrain" / "run_card.json").read_text())
    assert card["world_size"] == 2 and card["global_batch"] == 8 and card["updates"] == 3
    assert (out / "arms" / "ddp" / "pretrain.log").is_file()
    assert main(["ablate", str(path), "--arms", "ddp", "--launcher", "torchrun", "--nproc", "3",
                 "--no-report"]) == 0        # finished: skipped, whatever the launcher
    capsys.readouterr()


def test_shards_split_arms_disjointly():
    cfg = ablate_config.AblateConfig(tasks={"sst2": {}}, source="grid.yaml",
                              arms=[ablate.Arm(n) for n in ("base", "a", "b", "c", "d")]
                              + [ablate.Arm("probe", model_from="base"), ablate.Arm("probe2", model_from="probe")])
    ablate_config._check_grid(cfg)
    for n in (1, 2, 3, 7):
        shards = [[a.name for a in ablate_config.select_arms(cfg, shard=f"{i}/{n}")] for i in range(n)]
        names = [x for s in shards for x in s]
        assert sorted(names) == sorted(a.name for a in cfg.arms) and len(names) == len(set(names))
        assert any({"base", "probe", "probe2"} <= set(s) for s in shards)      # a model's users go with it
    assert [a.name for a in ablate_config.select_arms(cfg, ["c", "a"])] == ["a", "c"]
    with pytest.raises(BertkitError, match="unknown arm 'bsae'.*did you mean 'base'"):
        ablate_config.select_arms(cfg, ["bsae"])
    with pytest.raises(BertkitError, match="--shard"):
        ablate_config.select_arms(cfg, shard="2/2")


def test_config_mistakes(tmp_path):
    p = tmp_path / "g.yaml"
    p.write_text("tasks: {sst2: {}}\narms: [{name: base}]\nseedz: [1, 2]\n")
    with pytest.raises(BertkitError, match="unknown key 'seedz'; did you mean 'seeds'"):
        ablate_config.load_ablate_config(p)
    p.write_text("tasks: {sst2: {}}\narms: [{name: base}, {name: p, model_from: q}]\n")
    with pytest.raises(BertkitError, match="model_from 'q' must name an earlier arm"):
        ablate_config.load_ablate_config(p)
    p.write_text("tasks: {sst2: {}}\narms: [{name: x}]\n")
    with pytest.raises(BertkitError, match="base_arm 'base'"):
        ablate_config.load_ablate_config(p)
    p.write_text("tasks: {sst2: {}}\npretrain: {train: {max_stepz: 3}}\narms: [{name: base}]\n")
    with pytest.raises(BertkitError, match="base settings do not resolve.*max_stepz"):
        ablate.check_base(ablate_config.load_ablate_config(p))
    p.write_text("tasks: {sst2: {}}\nbudget: {match: time, time: 90s}\narms: [{name: base}, "
                 "{name: short, budget: {time: 30s}}, {name: c, model_from: base, checkpoint: 0}]\n")
    cfg = ablate_config.load_ablate_config(p)
    train = [ablate.resolve(cfg, a)["pretrain"]["train"] for a in cfg.arms[:2]]
    assert [(t["budget"], t["max_steps"] >= 10 ** 9) for t in train] == [("90s", True), ("30s", True)]
    assert ablate.dry_run(cfg, cfg.arms)[2]["status"] == "would fail"             # checkpoint 0
    p.write_text("tasks: {sst2: {}}\narms: [{name: base}, {name: odd, pretrian: {}}, "
                 "{name: worse, finetune: {lr: fast}}]\n")
    rows = ablate.dry_run(ablate_config.load_ablate_config(p), ablate_config.load_ablate_config(p).arms)
    assert [r["status"] for r in rows] == ["ok", "would fail", "would fail"]
    assert "did you mean 'pretrain'" in rows[1]["error"] and "lr" in rows[2]["error"]


@pytest.mark.parametrize("extra, says", [
    ("jobs: -1", "jobs must be at least 1, got -1"), ("jobs: two", "jobs: expected int"),
    ("threads: -1", "threads must be 0"), ("seeds: [0, x]", r"seeds\[1\] must be an integer"),
    ("seeds: [0, -1]", r"seeds\[1\] must be an integer"), ("corpus: 5", "corpus must be a list"),
    ("eval_documents: 0", "eval_documents must be at least 1"), ("budget: {steps: 0}", "budget.steps must be"),
    ("budget: {match: time, time: 0s}", "budget.time must be a positive"), ("keep_models: maybe", "keep_models"),
    ("split_seed: -1", "split_seed must be"), ("arms: {name: base}", "arms must be a list"),
    ("tasks: {nosuch: {data: sst}}", "unknown task 'nosuch'"), ("tasks: {sst2: {data: nodir}}", "data nodir: no such"),
    ("corpus: [missing.txt]", "missing.txt: no such file"),
    ("tasks: {sst2: {data: sst, train_limit: {a: 1}}}", "train_limit: expected int"),
    ("tasks: {sst2: {data: sst, train_limit: 0}}", "train_limit must be at least 1"),
    ("pretrain: {train: [1, 2]}", "pretrain.train is a section"), ("tasks: {sst2: [1]}", "tasks.sst2 must be a mapping"), ("--jobs 0", "jobs must be at least 1, got 0"),
    ("--nproc 0", "nproc must be at least 1, got 0"), ("--threads -1", "threads must be 0")])
def test_grid_mistakes_are_one_line_before_anything_is_written(grid, tmp_path, capsys, extra, says):
    """A mistake in the grid, its inputs or the options: exit 1 and one line naming it, in --dry-run
    as in a run, and no output folder."""
    from bertkit.cli import main

    text = grid[0].read_text().replace(f"out: {grid[0].parent / 'out'}", f"out: {tmp_path / 'out'}")
    options = extra.split() if extra.startswith("--") else []
    if not options:                          # the later of two equal keys wins
        text = text.replace("\narms:", f"\n{extra}\narms:", 1) if not extra.startswith("arms:") else \
            text.split("\narms:")[0] + f"\n{extra}\n"
    path = tmp_path / "grid.yaml"
    path.write_text(text)
    for run in (["--dry-run"], ["--arms", "base", "--no-report"]):
        capsys.readouterr()
        assert main(["ablate", str(path), *run, *options]) == 1, (extra, run)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and re.search(says, err[0]), (extra, run, err)
        assert not (tmp_path / "out").exists()


def test_a_grid_whose_arms_all_failed_exits_1(grid, tmp_path, capsys):
    from bertkit.cli import main

    text = grid[0].read_text().replace(f"out: {grid[0].parent / 'out'}", f"out: {tmp_path / 'out'}")
    path = tmp_path / "grid.yaml"
    path.write_text(text.split("\narms:")[0] + "\narms:\n  - {name: base, pretrian: {}}\n"
                    "  - {name: other, pretrain: {train: {no_such_key: 1}}}\n"
                    "  - {name: shape, pretrain: {train: [1, 2]}}\n")
    assert main(["ablate", str(path), "--dry-run"]) == 1
    out, err = capsys.readouterr()
    assert "3 of 3 arms would fail" in err and "pretrain.train is a section" in out
    assert main(["ablate", str(path), "--no-report"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out.splitlines()[-1])["failed"] == ["base", "other", "shape"]
    assert err.strip().splitlines()[-1].startswith("bertkit ablate: error: 3 of 3 arms failed")


@pytest.mark.parametrize("name", ["small", "gpu"])
def test_shipped_grids_resolve(name):
    path = REPO / "configs" / "ablate" / f"{name}.yaml"
    text = path.read_text()
    assert text.startswith("#") and "bertkit ablate configs/ablate/" in text.split("\n\n")[0]
    assert "wall time" in text.split("\n\n")[0].lower()
    cfg = ablate_config.load_ablate_config(path)
    rows = ablate.dry_run(cfg, cfg.arms)
    assert [r for r in rows if r["status"] != "ok"] == []
    names = {a.name for a in cfg.arms}
    assert len(cfg.seeds) >= 3 and {"sst2", "mrpc", "conll2003"} <= set(cfg.tasks)
    assert {"base", "no_pretraining", "mlm_only", "sop", "ltr", "whole_word", "span"} <= names
    assert sum(n.startswith("mask_") for n in names) == 5 and sum(n.startswith("size_") for n in names) >= 2
    assert any(a.finetune.get("freeze") for a in cfg.arms)
    assert sum(a.corpus_fraction < 1 for a in cfg.arms) >= 2 and sum(bool(a.checkpoint) for a in cfg.arms) >= 2
    assert sum(a.model_from is not None for a in cfg.arms) >= 1
    changed = {r["arm"]: r["changes"] for r in rows}
    for arm in cfg.arms:           # one setting each: the arms that pre-train change something
        if arm.name != cfg.base_arm and arm.pretrained and arm.model_from is None and arm.corpus_fraction == 1:
            assert changed[arm.name], arm.name


# ---- statistics --------------------------------------------------------------------------------
def test_welch_t_test_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    r = random.Random(1)
    for _ in range(20):
        a = [r.gauss(0.8, 0.02) for _ in range(r.randint(2, 6))]
        b = [r.gauss(0.8 + r.choice([0, 0.01, 0.05]), r.uniform(0.001, 0.05)) for _ in range(r.randint(2, 6))]
        t, df, p = welch_t_test(a, b)
        ref = stats.ttest_ind(a, b, equal_var=False)
        assert t == pytest.approx(ref.statistic, rel=1e-9) and p == pytest.approx(ref.pvalue, rel=1e-7, abs=1e-12)
    assert welch_t_test([0.5, 0.5], [0.5, 0.5])[2] == 1.0 and welch_t_test([0.6, 0.6], [0.5, 0.5])[2] == 0.0
    assert betainc(2.0, 3.0, 0.0) == 0.0 and betainc(2.0, 3.0, 1.0) == 1.0
    assert betainc(1.0, 1.0, 0.3) == pytest.approx(0.3, abs=1e-12)        # I_x(1, 1) = x
    delta, p, test = compare([0.9, 0.91, 0.92], [0.7, 0.71, 0.72])
    assert delta == pytest.approx(0.2) and p < 0.001 and "Welch" in test
    assert mean_std([0.5, 0.7]) == pytest.approx((0.6, math.sqrt(0.02))) and math.isnan(mean_std([0.5])[1])


def test_report_only_on_an_empty_grid(tmp_path):
    cfg = ablate_config.AblateConfig(out=str(tmp_path / "o"), tasks={"sst2": {}}, source="g.yaml",
                              arms=[ablate.Arm("base"), ablate.Arm("x")])
    text = write_report(cfg).read_text()
    assert "0 of 2 arms finished" in text and text.count("not run") == 2


# ---- the paper note's minimal implementation test -----------------------------------------------
def test_contract_test_random_encoder_and_cli(capsys):
    r = ablate.contract_test()
    assert r["passed"] and r["left_change_causal"] <= 1e-5 < r["left_change_bidirectional"]
    assert r["shape_causal"] == r["shape_bidirectional"] and r["right_change_causal"] > 1e-3
    from bertkit.cli import main
    assert main(["ablate", "--contract-test"]) == 0
    assert "passed" in capsys.readouterr().out


def test_contract_test_on_a_checkpoint(grid):
    path, _ = grid
    r = ablate.contract_test(path.parent / "out" / "arms" / "base" / "pretrain" / "final")
    assert r["passed"] and r["tokens"] > r["left_tokens"] > 2


# ---- sentence-order prediction pairs (prepare pair_mode: sop), the sop arm's data ----------------
def test_sop_pairs_are_consecutive_text_half_swapped():
    import numpy as np
    from bertkit.data.instances import BuildCounts, sop_instances
    from test_data_prepare import as_doc

    r = random.Random(0)
    docs = [as_doc([[1000 * d + 10 * s + k for k in range(r.randint(1, 9))] for s in range(r.randint(1, 7))])
            for d in range(300)]
    counts, insts = BuildCounts(), []
    for d in range(len(docs)):
        insts += sop_instances(docs, d, 512, 0.1, r, cls_id=1, sep_id=2, counts=counts)
    assert len(insts) > 250 and counts.random_next == sum(x.nsp_label for x in insts)
    assert 0.4 < counts.random_next / len(insts) < 0.6
    for x in insts:                 # no truncation at 512: in document order, A then B is one stretch of text
        t = x.tokens
        a, b = t[1:x.b_start - 1], t[x.b_start:-1]
        first, second = (b, a) if x.nsp_label else (a, b)
        text = np.concatenate([first, second])
        doc = docs[int(text[0]) // 1000].flat
        start = int(np.flatnonzero(doc == text[0])[0])
        assert len(a) and len(b) and np.array_equal(doc[start:start + len(text)], text)


def test_prepare_sop_and_its_checks(tmp_path):
    from bertkit import Tokenizer
    from bertkit.data.prepare import PrepareConfig, prepare

    with pytest.raises(BertkitError, match="pair_mode: 'sap' is not one of nsp, sop"):
        PrepareConfig(pair_mode="sap")
    with pytest.raises(BertkitError, match="sop builds sentence pairs"):
        PrepareConfig(pair_mode="sop", nsp=False)
    text = tmp_path / "t.txt"
    text.write_text((resources.files("bertkit") / "sample" / "sample.txt").read_text(encoding="utf-8"))
    tok = Tokenizer.train([str(text)], vocab_size=300)
    meta = prepare([str(text)], tok, tmp_path / "sop", PrepareConfig(max_length=64, pair_mode="sop"),
                   progress=False)
    assert meta["config"]["pair_mode"] == "sop" and meta["nsp"] and meta["counts"]["instances"] > 0
    assert 0.2 < meta["counts"]["random_next_fraction"] < 0.8


def test_masking_column_never_prints_minus_zero():
    """MASK/SAME/RND 80/0/20 (the paper's column order): SAME = 1 - 0.8 - 0.2 is -5.6e-17 in floating
    point, which printed as '-0'."""
    from bertkit.ablate.cards import _masking

    card = {"objective": "MLM + NSP", "masking": [{"as_trained": {"mode": "token", "mask_prob": 0.15,
            "mask_token_fraction": 0.8, "random_token_fraction": 0.2}, "overridden": True}]}
    assert _masking(card) == "token 15%, 80/0/20 (override)"


def test_rewording_a_setting_reruns_nothing_but_a_changed_override_does(tmp_path):
    """The plan key holds what decides an arm's numbers; the `setting` text is a label: an arm finished
    still counts as finished after its label is reworded."""
    arm = ablate.Arm(name="m", setting="masking 80/0/20", pretrain={"data": {"mask_token_fraction": 0.8}})
    cfg = ablate_config.AblateConfig(out=str(tmp_path), tasks={"sst2": {}}, source="g.yaml", arms=[arm])
    d = tmp_path / "arms" / "m"
    d.mkdir(parents=True)
    (d / "arm.json").write_text(json.dumps({"status": "done", "setting": "masking 80/0/20",
                                            "plan": ablate.plan_key(cfg, arm)}))
    reworded = ablate.Arm(name="m", setting="[MASK]/random/kept 80/0/20", pretrain=arm.pretrain)
    cfg.arms = [reworded]
    assert ablate.finished(cfg, reworded)
    assert ablate.plan_key(cfg, reworded) == ablate.plan_key(cfg, arm)
    changed = ablate.Arm(name="m", setting="[MASK]/random/kept 80/0/20",
                         pretrain={"data": {"mask_token_fraction": 0.7}})
    cfg.arms = [changed]
    assert not ablate.finished(cfg, changed)


def test_as_trained_reads_arm_json_where_run_cards_are_absent(tmp_path):
    """An arm copied from a committed result has arm.json but no run cards: its row gives batch, length,
    updates and precision from arm.json (marked so), not 'no pre-training'; a random-init arm keeps that."""
    from bertkit.ablate.cards import as_trained_section

    cfg = ablate_config.AblateConfig(out=str(tmp_path), tasks={"sst2": {}}, seeds=[0],
                                     arms=[ablate_config.Arm(name="base")])
    states = [{"name": "base", "status": "pretrained",
               "pretrain": {"tokens": 34868423, "updates": 10000, "global_batch": 32, "sequence_lengths": [128],
                            "precision": "bfloat16", "objective": "MLM + NSP"}},
              {"name": "no_pretraining", "status": "pretrained", "init": "random",
               "pretrain": {"tokens": 0, "updates": 0}}]
    rows = {ln.split(" | ")[0].strip("| "): ln for ln in as_trained_section(cfg, states) if ln.startswith("| ")}
    assert "| 32 x 128, 10000 (arm.json) |" in rows["base"] and "| bfloat16 |" in rows["base"]
    assert "no pre-training" not in rows["base"] and "| no pre-training |" in rows["no_pretraining"]
