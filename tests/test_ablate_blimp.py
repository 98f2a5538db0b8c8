"""BLiMP inside `bertkit ablate`: every arm's model scored zero-shot, cached, per-pair outcomes kept."""
from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path

import pytest

from bertkit import ablate, blimp

from bertkit.ablate import config as ablate_config, measure as ablate_measure, report as ablate_report
from bertkit.ablate import zeroshot as ablate_zeroshot
from bertkit.errors import BertkitError
from test_ablate import write_tasks

GRID = """\
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
finetune: {{max_length: 32, batch_size: 8, epochs: 1, lr: 1.0e-3}}
tasks:
  sst2: {{data: sst}}
seeds: [0, 1]
budget: {{match: tokens, steps: 2}}
mlm_eval_instances: 16
blimp: {{data: {pairs}, limit: 1}}
threads: 1
arms:
  - {{name: base}}
  - {{name: ltr, pretrain: {{model: {{causal: true}}, train: {{objective: clm, nsp: false}}}}}}
"""


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    root = tmp_path_factory.mktemp("ablate_blimp")
    write_tasks(root / "data")
    corpus = Path(str(resources.files("bertkit") / "sample" / "inaugural.txt.gz"))
    pairs = Path(str(resources.files("bertkit") / "sample" / "blimp_sample.jsonl.gz"))
    path = root / "grid.yaml"
    path.write_text(GRID.format(out=root / "out", data=root / "data", corpus=corpus, pairs=pairs), encoding="utf-8")
    cfg = ablate_config.load_ablate_config(path)
    ablate.run_grid(cfg, cfg.arms)
    return cfg, pairs


def test_every_arm_gets_blimp_with_its_interval_and_per_pair_outcomes(grid):
    cfg, pairs = grid
    n = len(blimp.read_pairs([pairs], limit=1))
    for name, method in (("base", "pll"), ("ltr", "causal")):
        d = Path(cfg.out) / "arms" / name
        got = json.loads((d / "arm.json").read_text())["blimp"]
        assert got["pairs"] == n and got["method"] == method
        assert got["low"] <= got["accuracy"] <= got["high"] and 0 <= got["accuracy"] <= 1
        outcomes = (d / "blimp_correct.txt").read_text().strip()
        assert len(outcomes) == n and set(outcomes) <= {"0", "1"}
        assert outcomes.count("1") / n == pytest.approx(got["accuracy"])


def test_blimp_is_cached_by_model_and_settings(grid, monkeypatch):
    cfg, _ = grid
    d = Path(cfg.out) / "arms" / "base"
    model = Path(json.loads((d / "arm.json").read_text())["model"])
    before = json.loads((d / "blimp.json").read_text())["summary"]

    def boom(*a, **k):
        raise AssertionError("scored again")

    monkeypatch.setattr(blimp, "score_pairs", boom)
    assert ablate.arm_blimp(cfg, model, d) == before
    cfg.blimp = {**cfg.blimp, "limit": 2}
    with pytest.raises(AssertionError, match="scored again"):
        ablate.arm_blimp(cfg, model, d)


@pytest.mark.parametrize("value, says", [({"limit": 3}, "blimp takes data"), ({"data": "x", "limit": 0}, "blimp.limit"),
                                         ({"data": "x", "bogus": 1}, "blimp takes data")])
def test_blimp_key_mistakes_are_one_line(value, says):
    with pytest.raises(BertkitError, match=says):
        ablate_config.AblateConfig(blimp=value)


@pytest.mark.parametrize("name", ["cpu", "gpu-10min"])
def test_the_grids_that_learn_resolve_and_cover_the_axes(name):
    path = Path(__file__).resolve().parents[1] / "configs" / "ablate" / f"{name}.yaml"
    cfg = ablate_config.load_ablate_config(path)
    rows = ablate.dry_run(cfg, cfg.arms)
    assert [r for r in rows if r["status"] != "ok"] == []
    names = {a.name for a in cfg.arms}
    assert {"base", "no_pretraining", "mlm_only", "sop", "mask_100_0_0", "mask_0_0_100", "whole_word", "span",
            "ltr", "paper_arch", "data_10pct"} <= names
    assert sum(n.startswith("size_") for n in names) >= 2 and sum(bool(a.checkpoint) for a in cfg.arms) >= 2
    assert len(cfg.seeds) >= 5 and cfg.blimp.get("data") and {"sst2", "mrpc", "conll2003"} <= set(cfg.tasks)
    assert "wall time" in path.read_text().split("\n\n")[0].lower()
    if name == "gpu-10min":         # twice the CPU grid's training tokens per arm
        cpu = ablate_config.load_ablate_config(path.with_name("cpu.yaml"))
        tokens = {c.budget.steps * c.pretrain["train"]["batch_size"] for c in (cfg, cpu)}
        assert max(tokens) == cfg.budget.steps * cfg.pretrain["train"]["batch_size"] >= 2 * min(tokens)


def test_arms_with_an_nsp_head_get_the_topic_shortcut_and_the_report_has_both_sections(grid):
    cfg, _ = grid
    arms = {n: json.loads((Path(cfg.out) / "arms" / n / "arm.json").read_text()) for n in ("base", "ltr")}
    r = arms["base"]["nsp_shortcut"]
    assert set(r["kinds"]) == {"is_next", "random_document", "same_document"}
    assert all(0 <= r["kinds"][k]["nsp_accuracy"] <= 1 for k in r["kinds"])
    assert 0 <= r["against_is_next"]["same_document"]["topic_auc"] <= 1
    assert arms["ltr"]["nsp_shortcut"] is None                       # a left-to-right model has no NSP head
    text = (Path(ablate_report.write_report(cfg))).read_text()
    assert "## BLiMP, zero-shot" in text and "## NSP's topic shortcut" in text
    assert (Path(cfg.out) / "plots" / "blimp.png").stat().st_size > 0 and "(plots/blimp.png)" in text
    blimp_rows = [x for x in text.splitlines() if x.startswith(("| base | pll", "| ltr | causal"))]
    assert len(blimp_rows) == 2 and "| base |" in blimp_rows[0] and "base" in blimp_rows[0].split("|")[4]


def test_the_paired_difference_is_the_mean_of_per_pair_differences_with_its_normal_interval():
    d, lo, hi = ablate_zeroshot.paired_difference("1101", "0111")      # differences +1, 0, -1, 0
    sd = (2 / 3) ** 0.5
    assert d == 0 and lo == pytest.approx(-1.959964 * sd / 2) and hi == pytest.approx(1.959964 * sd / 2)
    assert ablate_zeroshot.paired_difference("11", "1") is None        # not the same pairs


def test_the_unpaired_difference_is_two_independent_proportions():
    d, lo, hi = ablate_zeroshot.unpaired_difference({"accuracy": 0.6, "pairs": 100}, {"accuracy": 0.5, "pairs": 100})
    half = 1.959964 * ((0.6 * 0.4 + 0.5 * 0.5) / 100) ** 0.5
    assert d == pytest.approx(0.1) and lo == pytest.approx(0.1 - half) and hi == pytest.approx(0.1 + half)
    assert ablate_zeroshot.unpaired_difference({"accuracy": 0.6, "pairs": 100}, {"accuracy": 0.5, "pairs": 99}) is None


def test_an_arm_without_its_per_pair_outcomes_is_compared_unpaired_and_says_so(grid, tmp_path):
    import dataclasses
    import shutil

    cfg, _ = grid
    paired = next(x for x in ablate_zeroshot.blimp_section(cfg, ablate_report.collect(cfg)[0]) if x.startswith("| ltr |"))
    assert "unpaired" not in paired                                        # both kept: the paired interval
    shutil.copytree(cfg.out, tmp_path / "out")
    (tmp_path / "out" / "arms" / "base" / "blimp_correct.txt").unlink()     # the base scored elsewhere
    moved = dataclasses.replace(cfg, out=str(tmp_path / "out"))
    lines = ablate_zeroshot.blimp_section(moved, ablate_report.collect(moved)[0])
    row = next(x for x in lines if x.startswith("| ltr |"))
    arms = {n: json.loads((tmp_path / "out" / "arms" / n / "arm.json").read_text())["blimp"] for n in ("base", "ltr")}
    want = ablate_zeroshot.unpaired_difference(arms["ltr"], arms["base"])
    assert row.split("|")[4].strip() == f"{ablate_measure.delta_cell(want)} unpaired"


def test_pretrain_only_scores_without_fine_tuning_and_the_full_run_reuses_it(tmp_path, monkeypatch):
    write_tasks(tmp_path / "data")
    corpus = Path(str(resources.files("bertkit") / "sample" / "inaugural.txt.gz"))
    pairs = Path(str(resources.files("bertkit") / "sample" / "blimp_sample.jsonl.gz"))
    path = tmp_path / "grid.yaml"
    text = GRID.format(out=tmp_path / "out", data=tmp_path / "data", corpus=corpus, pairs=pairs)
    path.write_text(text.split("  - {name: ltr")[0], encoding="utf-8")          # the base arm alone
    cfg = ablate_config.load_ablate_config(path)
    summary = ablate.run_grid(cfg, cfg.arms, ablate.RunOptions(pretrain_only=True))
    d = Path(cfg.out) / "arms" / "base"
    state = json.loads((d / "arm.json").read_text())
    assert summary["failed"] == [] and state["status"] == "pretrained"
    assert state["mlm"]["accuracy_mask"] is not None and state["blimp"]["pairs"] > 0
    assert not (d / "finetune").exists() and not ablate.finished(cfg, cfg.arms[0])
    assert ablate.finished(cfg, cfg.arms[0], pretrain_only=True)
    report = ablate_report.write_report(cfg).read_text()
    assert "not fine-tuned yet" in report and "0 of 1 arms finished, 1 more pre-trained and scored (not fine-tuned yet). Budget matched by **training tokens**" in report
    assert "(no arm has been fine-tuned yet)" in report and "## Reproduction checklist (the paper note's" in report
    assert ablate.run_grid(cfg, cfg.arms, ablate.RunOptions(pretrain_only=True))["skipped"] == ["base"]
    weights = ablate.weights_id(Path(state["model"]))

    def boom(*a, **k):
        raise AssertionError("scored again")

    monkeypatch.setattr(blimp, "score_pairs", boom)                  # the full run reuses pre-training and BLiMP
    assert ablate.run_grid(cfg, cfg.arms)["failed"] == []
    state = json.loads((d / "arm.json").read_text())
    assert state["status"] == "done" and ablate.weights_id(Path(state["model"])) == weights
    assert (d / "results.jsonl").read_text().count("\n") == 2                     # sst2 x seeds 0, 1


def test_the_plateau_study_shares_the_cpu_grid_s_base():
    """configs/ablate/cpu-plateau.yaml is cpu.yaml above `arms:` (one output folder serves both: the same data,
    tokenizer and base arm), and its arms that cpu.yaml also has are the same arms."""
    folder = Path(__file__).resolve().parents[1] / "configs" / "ablate"
    grid, plateau = (ablate_config.load_ablate_config(folder / f"{n}.yaml") for n in ("cpu", "cpu-plateau"))
    assert [r for r in ablate.dry_run(plateau, plateau.arms) if r["status"] != "ok"] == []
    top = lambda c: {f.name: getattr(c, f.name) for f in dataclasses.fields(c) if f.name not in ("arms", "source")}
    assert top(plateau) == top(grid)
    shared = {a.name for a in plateau.arms} & {a.name for a in grid.arms}
    assert shared == {"base", "paper_arch"}
    by = lambda c: {a.name: a for a in c.arms}
    assert all(by(plateau)[n] == by(grid)[n] for n in shared)
    assert {"paper_arch_bert_init", "post_ln", "abs_pos", "dropout"} <= set(by(plateau))
