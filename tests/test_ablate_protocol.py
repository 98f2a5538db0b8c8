"""`bertkit ablate`'s downstream protocol: the learning rate chosen on dev per arm x task, Welch intervals,
collapsed seeds, held-out MLM at [MASK] with the unigram baseline, budgets matched by FLOPs."""
from __future__ import annotations

import json
import math
import random
from importlib import resources
from pathlib import Path

import pytest

from bertkit import ablate

from bertkit.ablate import config as ablate_config, measure as ablate_measure
from bertkit.ablate.config import _key
from bertkit.ablate.report import difference_ci, t_quantile, welch_t_test, write_report
from bertkit.errors import BertkitError
from test_ablate import MICRO, write_tasks

GRID = MICRO.split("tasks:")[0] + """\
tasks:
  sst2: {{data: sst}}
seeds: [0, 1]
lr_search: {{lrs: [1.0e-5, 3.0e-3]}}
budget: {{match: tokens, steps: 2}}
mlm_eval_instances: 16
threads: 1
arms:
  - {{name: base}}
  - {{name: ltr_flops, pretrain: {{model: {{causal: true}}, train: {{objective: clm, nsp: false}}}},
     budget: {{match: flops}}}}
  - {{name: fixed, model_from: base, finetune: {{lr: 2.0e-3}}}}
"""


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    root = tmp_path_factory.mktemp("ablate_protocol")
    write_tasks(root / "data")
    corpus = Path(str(resources.files("bertkit") / "sample" / "inaugural.txt.gz"))
    path = root / "grid.yaml"
    path.write_text(GRID.format(out=root / "out", data=root / "data", corpus=corpus), encoding="utf-8")
    cfg = ablate_config.load_ablate_config(path)
    summary = ablate.run_grid(cfg, cfg.arms)
    write_report(cfg)
    return path, summary


def rows_of(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x]


# ---- the learning rate chosen on dev -------------------------------------------------------------
def test_lr_search_runs_candidates_at_the_first_seed_then_every_seed_at_the_best(grid):
    path, summary = grid
    out = path.parent / "out"
    assert summary["failed"] == []
    rows = rows_of(out / "arms" / "base" / "results.jsonl")
    cands = [r for r in rows if r["status"] == "lr_candidate"]
    ok = [r for r in rows if r["status"] == "ok"]
    assert sorted((r["lr"], r["seed"]) for r in cands) == [(1e-5, 0), (3e-3, 0)]
    best = max(cands, key=lambda r: (r["value"], -r["lr"]))          # a tie goes to the rate listed first
    chosen = [r for r in cands if r["chosen"]]
    assert len(chosen) == 1 and chosen[0]["lr"] == best["lr"]
    assert [r["seed"] for r in ok] == [0, 1] and {r["lr"] for r in ok} == {best["lr"]}
    assert ok[0]["lr_candidates"] == {"1e-05": cands[0]["value"], "0.003": cands[1]["value"]}
    state = json.loads((out / "arms" / "base" / "arm.json").read_text())
    assert state["lr_chosen"] == {"sst2": best["lr"]}
    assert (out / "arms" / "base" / "finetune" / "sst2" / f"lr{best['lr']:g}" / "seed1" / "run_card.md").is_file()
    # the seed-0 run at the chosen rate is the candidate run, not trained twice
    log = (out / "arms" / "base" / "log.txt").read_text()
    assert log.count("fine-tuning sst2, seed 0") == 2 and log.count("fine-tuning sst2, seed 1") == 1
    # an arm that fixes its own rate keeps it: no candidates
    fixed = rows_of(out / "arms" / "fixed" / "results.jsonl")
    assert {r["status"] for r in fixed} == {"ok"} and {r["lr"] for r in fixed} == {2e-3}
    report = (out / "REPORT.md").read_text()
    section = report.split("## Learning rate chosen on dev")[1].split("##")[0]
    assert "| lr 1e-05 | lr 0.003 |" in section and "| base | sst2 |" in section and "**" in section
    main = report.split("How to read it")[0]
    assert f"lr {best['lr']:g}" in next(ln for ln in main.splitlines() if ln.startswith("| base |"))


@pytest.mark.parametrize("on, chosen, runs", [("all", 1e-4, 4), ("first", 1e-3, 3)])
def test_the_rate_with_the_best_dev_mean_over_the_selection_seeds_wins(monkeypatch, tmp_path, on, chosen, runs):
    """Every seed: 1e-4 (mean 0.75) beats 1e-3 (0.70); on the first seed alone 1e-3 (0.8) beats 1e-4 (0.6).
    A run without a dev score counts as the worst; a tie goes to the rate listed first."""
    scores = {(1e-4, 0): 0.6, (1e-4, 1): 0.9, (1e-3, 0): 0.8, (1e-3, 1): 0.6}
    calls = []

    def fake(cfg, arm, task, seed, model, init, d, pre, lr=None):
        calls.append((lr, seed))
        return {"arm": arm.name, "task": task, "seed": seed, "lr": lr, "value": scores[(lr, seed)], "status": "ok"}

    monkeypatch.setattr(ablate.arm, "_finetune_one", fake)
    cfg = ablate_config.AblateConfig(out=str(tmp_path), tasks={"sst2": {}}, seeds=[0, 1], source="g.yaml",
                                     lr_search={"lrs": [1e-3, 1e-4], "seeds": on}, arms=[ablate.Arm("base")])
    state: dict = {}
    rows = ablate.arm._finetune_task(cfg, cfg.arms[0], "sst2", tmp_path / "m", "pretrained", tmp_path, {}, state)
    assert state["lr_chosen"] == {"sst2": chosen} and len(calls) == len(set(calls)) == runs
    assert [(r["lr"], r["seed"]) for r in rows if r["status"] == "ok"] == [(chosen, 0), (chosen, 1)]
    assert sum(r["status"] == "lr_candidate" for r in rows) == (4 if on == "all" else 2)
    assert ablate_measure.choose_lr({1e-3: [None], 1e-4: [0.1]})[0] == 1e-4


def test_a_diverging_candidate_rate_is_the_searchs_worst_not_the_arms_failure(monkeypatch, tmp_path):
    """A random-init model diverged at lr 1e-3 on a GPU (bf16) and failed its whole arm: the candidate is
    a row saying so, the search picks among the rest; only when every candidate diverges does the task fail."""
    from bertkit.errors import DivergedError

    def fake(cfg, arm, task, seed, model, init, d, pre, lr=None):
        if lr == 1e-3:
            raise DivergedError("loss is nan at update 216; lower the learning rate")
        return {"arm": arm.name, "task": task, "seed": seed, "lr": lr, "value": 0.7, "status": "ok"}

    monkeypatch.setattr(ablate.arm, "_finetune_one", fake)
    cfg = ablate_config.AblateConfig(out=str(tmp_path), tasks={"sst2": {}}, seeds=[0, 1], source="g.yaml",
                                     lr_search={"lrs": [1e-3, 1e-4]}, arms=[ablate.Arm("base")])
    state: dict = {}
    rows = ablate.arm._finetune_task(cfg, cfg.arms[0], "sst2", tmp_path / "m", "random", tmp_path, {}, state)
    assert state["lr_chosen"] == {"sst2": 1e-4}
    diverged = [r for r in rows if r.get("diverged")]
    assert len(diverged) == 1 and diverged[0]["status"] == "lr_candidate" and diverged[0]["value"] is None
    assert [(r["lr"], r["seed"]) for r in rows if r["status"] == "ok"] == [(1e-4, 0), (1e-4, 1)]
    table = "\n".join(ablate.report.lr_section(cfg, rows))
    assert "| base | sst2 | **0.700** | diverged |" in table           # rates sorted: 1e-4, 1e-3
    cfg.lr_search = {"lrs": [1e-3]}
    with pytest.raises(DivergedError, match="every candidate rate diverged"):
        ablate.arm._finetune_task(cfg, cfg.arms[0], "sst2", tmp_path / "m", "random", tmp_path, {}, {})
    assert ablate_measure.choose_lr({1e-3: [0.5], 1e-4: [0.5]})[0] == 1e-3


def test_plan_key_of_a_grid_without_the_new_keys_is_unchanged(tmp_path):
    """Arms finished before lr_search and budget.match flops existed stay finished."""
    arm = ablate.Arm(name="base")
    cfg = ablate_config.AblateConfig(out=str(tmp_path), tasks={"sst2": {}}, source="g.yaml", arms=[arm])
    old = {"arm": {"name": "base"}, "base": [cfg.corpus, cfg.eval_documents, cfg.split_seed, cfg.tokenizer,
                                             cfg.prepare, cfg.pretrain, cfg.finetune, cfg.tasks, cfg.seeds,
                                             {"match": "tokens", "steps": 1000, "time": None}, cfg.mlm_eval_instances],
           "source": []}
    assert ablate.plan_key(cfg, arm) == _key(old)
    cfg.lr_search = {"lrs": [1e-4]}
    assert ablate.plan_key(cfg, arm) != _key(old)


# ---- held-out MLM at [MASK], the unigram baseline --------------------------------------------------
def test_heldout_mlm_at_mask_positions_and_the_unigram_baseline(grid):
    path, _ = grid
    out = path.parent / "out"
    mlm = json.loads((out / "arms" / "base" / "arm.json").read_text())["mlm"]
    assert 0 < mlm["mask_predictions"] < mlm["predictions"]
    assert 0.6 < mlm["mask_predictions"] / mlm["predictions"] < 0.95            # ~80% shown as [MASK]
    assert 0 <= mlm["accuracy_mask"] <= 1 and mlm["unigram"]["token"]
    assert 0 < mlm["unigram"]["share"] <= 1 and 0 < mlm["unigram"]["share_mask"] <= 1
    assert json.loads((out / "arms" / "ltr_flops" / "arm.json").read_text())["mlm"] is None
    rows = rows_of(out / "arms" / "base" / "results.jsonl")
    assert {r["mlm_accuracy_mask"] for r in rows} == {mlm["accuracy_mask"]}
    report = (out / "REPORT.md").read_text()
    assert f"most common target token `{mlm['unigram']['token']}` scores {mlm['unigram']['share_mask']:.3f}" in report
    base = next(ln for ln in report.splitlines() if ln.startswith("| base |"))
    assert f"| {mlm['accuracy_mask']:.3f} | base | {mlm['accuracy']:.3f} |" in base
    assert "| n/a (causal) | n/a | n/a" in next(ln for ln in report.splitlines() if ln.startswith("| ltr_flops |"))


def test_heldout_mlm_keeps_per_sequence_outcomes_at_mask(grid):
    path, _ = grid
    arm = path.parent / "out" / "arms" / "base"
    mlm = json.loads((arm / "arm.json").read_text())["mlm"]
    o = json.loads((arm / ablate_measure.OUTCOMES).read_text())
    assert len(o["masked"]) == len(o["correct"]) == mlm["instances"]
    assert sum(o["masked"]) == mlm["mask_predictions"]
    assert all(0 <= c <= m for c, m in zip(o["correct"], o["masked"]))
    assert sum(o["correct"]) / sum(o["masked"]) == pytest.approx(mlm["accuracy_mask"])
    assert ablate_measure.paired_mlm_difference(o, o) == (0.0, 0.0, 0.0)


def test_the_paired_mlm_difference_is_clustered_by_sequence():
    from bertkit.ablate.zeroshot import paired_difference
    rng = random.Random(0)
    a = [rng.randint(0, 1) for _ in range(200)]
    b = [rng.randint(0, 1) for _ in range(200)]
    one = {"masked": [1] * 200}
    # one position per sequence: the clustered interval is the plain paired one
    got = ablate_measure.paired_mlm_difference({**one, "correct": a}, {**one, "correct": b})
    want = paired_difference("".join(map(str, a)), "".join(map(str, b)))
    assert got == pytest.approx(want, abs=1e-12)
    # sequences of 10 positions that move together: the same mean, a wider interval than 2,000 independent ones
    m = [10] * 200
    c_a, c_b = [10 * x for x in a], [10 * x for x in b]
    d, lo, hi = ablate_measure.paired_mlm_difference({"masked": m, "correct": c_a}, {"masked": m, "correct": c_b})
    assert d == pytest.approx(want[0]) and hi - lo == pytest.approx(want[2] - want[1], rel=1e-9)
    flat = paired_difference("".join(str(x) * 10 for x in a), "".join(str(x) * 10 for x in b))
    assert hi - lo > 3 * (flat[2] - flat[1])
    assert ablate_measure.paired_mlm_difference({"masked": m, "correct": c_a}, {"masked": m[:-1] + [9], "correct": c_b}) is None


def test_the_paired_ratio_difference_of_accuracies_is_the_plain_paired_interval():
    from bertkit.ablate.zeroshot import paired_difference
    rng = random.Random(1)
    a = [rng.randint(0, 1) for _ in range(300)]
    b = [x if rng.random() < 0.8 else 1 - x for x in a]               # paired: mostly the same answers
    ones = [1] * 300
    got = ablate_measure.paired_ratio_difference(a, ones, b, ones)
    want = paired_difference("".join(map(str, a)), "".join(map(str, b)))
    assert got == pytest.approx(want, abs=1e-12)
    d = [x - y for x, y in zip(a, b)]                                   # mean of d, se = sd(d) / sqrt(n)
    mean = sum(d) / 300
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / 299 / 300)
    assert got == pytest.approx((mean, mean - 1.959964 * se, mean + 1.959964 * se), abs=1e-12)
    assert ablate_measure.paired_ratio_difference(a, ones, b[:-1], ones[:-1]) is None     # not the same examples
    assert ablate_measure.paired_ratio_difference([1], [1], [0], [1]) is None              # n < 2
    assert ablate_measure.paired_ratio_difference([0, 0], [0, 0], [1, 0], [1, 1]) is None  # nothing to divide by


def test_the_paired_f1_difference_covers_the_true_difference():
    """Two correlated classifiers of a 40%-positive population, binary F1 as a ratio of sums: over 400 dev
    sets of 300 examples the 95% interval holds the population's difference about 95% of the time, and
    the * of `delta_cell` is there when the interval excludes 0."""
    from bertkit.tasks.metrics import example_counts

    def sample(rng, n):
        ref = ["1" if rng.random() < 0.4 else "0" for _ in range(n)]
        u = [rng.random() for _ in range(n)]                            # shared difficulty: paired errors
        a = [r if x < 0.85 else "01"[r == "0"] for r, x in zip(ref, u)]
        b = [r if x < 0.75 or rng.random() < 0.2 else "01"[r == "0"] for r, x in zip(ref, u)]
        return example_counts("f1", ref, a), example_counts("f1", ref, b)

    (an, ad), (bn, bd) = sample(random.Random(0), 200_000)
    truth = sum(an) / sum(ad) - sum(bn) / sum(bd)
    rng, hits, starred = random.Random(1), 0, 0
    for _ in range(400):
        (an, ad), (bn, bd) = sample(rng, 300)
        diff, low, high = ablate_measure.paired_ratio_difference(an, ad, bn, bd)
        assert low < diff < high and diff == pytest.approx(sum(an) / sum(ad) - sum(bn) / sum(bd))
        hits += low <= truth <= high
        starred += ablate_measure.delta_cell((diff, low, high)).endswith(" *") == (low > 0 or high < 0)
    assert 0.92 <= hits / 400 <= 0.98 and starred == 400
    assert ablate_measure.delta_cell((0.05, 0.01, 0.09)) == "+0.050 [+0.010, +0.090] *"
    assert ablate_measure.delta_cell((0.05, -0.01, 0.11)) == "+0.050 [-0.010, +0.110]"
    assert ablate_measure.delta_cell((-0.05, -0.09, -0.01)).endswith(" *")


def test_the_probe_table_has_paired_deltas_against_the_base_models_probes(tmp_path):
    """Tiny fake probe results: each probe arm's cell has its Δ against the base model's probe arm on the
    same dev examples (that one against the random model's), n/a for MCC, — where outcomes are missing."""
    from bertkit.ablate.report import probe_section
    from bertkit.linear_probe import write_results

    spec = {"features": ["last"]}
    arms = [ablate.Arm("base"), ablate.Arm("no_pretraining", pretrained=False), ablate.Arm("mlm_only"),
            ablate.Arm("probe_base", model_from="base", probe=spec),
            ablate.Arm("probe_random", model_from="no_pretraining", probe=spec),
            ablate.Arm("probe_mlm_only", model_from="mlm_only", probe=spec)]
    cfg = ablate_config.AblateConfig(out=str(tmp_path), tasks={"sst2": {}, "cola": {}}, source="g.yaml", arms=arms)
    right = {"probe_base": [1] * 18 + [0, 0], "probe_random": [1] * 10 + [0] * 10, "probe_mlm_only": [1] * 17 + [0] * 3}
    rows = []
    for arm, num in right.items():
        for task in ("sst2", "cola"):
            outcomes = {"num": num, "den": [1] * 20} if task == "sst2" else None
            ids = [str(i) for i in range(20 - (arm == "probe_mlm_only" and task == "cola"))]
            write_results(tmp_path / "arms" / arm / "probe" / task / "results.json",
                          {"dev_ids": ids, "probes": [{"features": "last", "pooling": "mean", "outcomes": outcomes}]})
            rows.append({"arm": arm, "task": task, "variant": "last/mean", "probe": "lbfgs", "status": "ok",
                         "value": sum(num) / 20, "C": 1.0, "converged": True, "majority": 0.5,
                         "probe_features": "last", "probe_pooling": "mean"})
    text = "\n".join(probe_section(cfg, rows))
    assert ("| task | features | probe_base (base) | Δ vs probe_random [95%] | probe_random (no_pretraining) | "
            "Δ vs probe_base [95%] | probe_mlm_only (mlm_only) | Δ vs probe_base [95%] | majority |") in text
    ones = [1] * 20
    vs_random = ablate_measure.delta_cell(ablate_measure.paired_ratio_difference(right["probe_base"], ones,
                                                                                 right["probe_random"], ones))
    vs_base = ablate_measure.delta_cell(ablate_measure.paired_ratio_difference(right["probe_mlm_only"], ones,
                                                                               right["probe_base"], ones))
    assert vs_random.startswith("+0.400 [") and vs_random.endswith(" *") and vs_base.startswith("-0.050 [")
    sst2 = next(x for x in text.splitlines() if x.startswith("| sst2 | last/mean |"))
    cells = sst2.split(" | ")
    assert cells[2:4] == ["0.900 (C 1)", vs_random] and cells[6:8] == ["0.850 (C 1)", vs_base]
    assert cells[5].startswith("-0.400 [") and cells[5].endswith(" *")
    cola = next(x for x in text.splitlines() if x.startswith("| cola | last/mean |")).split(" | ")
    assert cola[3] == cola[5] == "n/a" and cola[7] == "—"              # MCC: no interval; other dev examples
    assert "delta method" in text and "n/a: a metric that is no ratio of sums" in text
    # results written before the outcomes were kept: no Δ; a grid with no base probe arm: no Δ column
    write_results(tmp_path / "arms" / "probe_random" / "probe" / "sst2" / "results.json", {"probes": [{}]})
    assert next(x for x in probe_section(cfg, rows) if x.startswith("| sst2 |")).split(" | ")[3] == "—"
    alone = [r for r in rows if r["arm"] == "probe_mlm_only"]
    assert "| task | features | probe_mlm_only (mlm_only) | majority |" in probe_section(cfg, alone)
    # probe arms finished before their results kept outcomes are redone on the next run
    assert ablate.arm._plan(cfg, arms[3])["probe_results"] >= 2
    assert "probe_results" not in ablate.arm._plan(cfg, arms[0])


# ---- collapsed seeds ------------------------------------------------------------------------------
def test_collapsed_seeds_are_recorded_and_counted(grid):
    from bertkit.finetune import predicted_counts
    from bertkit.tasks import get_task

    path, _ = grid
    rows = [r for r in rows_of(path.parent / "out" / "arms" / "base" / "results.jsonl")]
    for r in rows:
        assert sum(r["predicted"].values()) == r["dev_examples"]
        assert r["collapsed"] == (len(r["predicted"]) == 1)
    report = (path.parent / "out" / "REPORT.md").read_text()
    ok = [r for r in rows if r["status"] == "ok"]
    k = sum(r["collapsed"] for r in ok)
    base = next(ln for ln in report.splitlines() if ln.startswith("| base |"))
    assert (f"{k} of {len(ok)} collapsed" in base) == (k > 0)
    ner = get_task("conll2003")
    assert predicted_counts(ner, {"a": ["O", "O"], "b": ["O"]}) == {"O": 3}
    assert ablate_measure.collapse_of({"main_metric": "f1", "history": [{"dev_f1": 0.0, "dev_predicted": {"O": 3}}]}) \
        == {"predicted": {"O": 3}, "collapsed": True}
    assert ablate_measure.collapse_of({"main_metric": "f1", "history": [
        {"dev_f1": 0.0, "dev_predicted": {"O": 3}}, {"dev_f1": 0.3, "dev_predicted": {"O": 3, "B-PER": 1}}]}
    )["collapsed"] is False
    assert ablate_measure.collapse_of({"main_metric": "f1", "history": [{"dev_f1": 0.2}]})["collapsed"] is None
    assert predicted_counts(get_task("squad"), {"q": "an answer"}) is None


# ---- budgets matched by FLOPs ----------------------------------------------------------------------
def test_update_flops_counts_the_head_where_each_objective_projects():
    from bertkit.config import preset
    from bertkit.runlog import step_flops

    cfg = ablate_config.AblateConfig(tasks={"sst2": {}}, source="g.yaml", tokenizer={"vocab_size": 1000},
                                     prepare={"max_length": 128},
                                     pretrain={"model": {"preset": "tiny", "hidden_size": 64, "num_heads": 2,
                                                         "intermediate_size": 256, "num_layers": 2},
                                               "train": {"batch_size": 16, "grad_accum": 2}})
    mlm, clm = ablate.Arm("base"), ablate.Arm("ltr", pretrain={"model": {"causal": True},
                                                                "train": {"objective": "clm", "nsp": False}})
    bert = preset("tiny", vocab_size=1000, hidden_size=64, num_heads=2, intermediate_size=256, num_layers=2)
    B, T = 32, 128
    assert ablate_measure.update_flops(cfg, mlm) == step_flops(bert, B * T, B, T, B * 19, True)   # round(125 x 0.15)
    assert ablate_measure.update_flops(cfg, clm) == step_flops(bert, B * T, B, T, B * 127, False)
    C, V = 64, 1000
    head = 3 * 2 * (C * C + C * V)                     # training FLOPs of one projected position
    encoder = 3 * (2 * 2 * (4 * C * C + 2 * C * 256) * T + 4 * T * T * C * 2)        # per sequence
    assert ablate_measure.update_flops(cfg, clm) == pytest.approx(B * (encoder + 127 * head))


def test_flops_budget_gives_the_costlier_arm_fewer_updates(grid):
    path, _ = grid
    out = path.parent / "out"
    cfg = ablate_config.load_ablate_config(path)
    base, ltr = cfg.arms[0], cfg.arms[1]
    b = ablate_measure.budget_of(cfg, ltr)
    ratio = ablate_measure.update_flops(cfg, base) / ablate_measure.update_flops(cfg, ltr)
    assert ratio < 1 and b["steps"] == max(1, round(2 * ratio)) and b["reference"] == "base"
    assert ablate.arm_budget(cfg, ltr)["train"]["max_steps"] == b["steps"]
    state = json.loads((out / "arms" / "ltr_flops" / "arm.json").read_text())
    assert state["budget"]["match"] == "flops" and state["budget"]["updates"] == b["steps"]
    assert state["budget"]["matched_to"] == {"arm": "base", "updates": 2, "flops": 2 * ablate_measure.update_flops(cfg, base)}
    assert state["pretrain"]["updates"] == b["steps"]
    assert json.loads((out / "arms" / "base" / "arm.json").read_text())["budget"]["match"] == "tokens"
    # the grid-level switch: every arm gets the base's FLOPs; the base keeps its updates; an arm's own steps win
    cfg.budget.match = "flops"
    assert ablate_measure.budget_of(cfg, base)["steps"] == 2
    assert ablate_measure.budget_of(cfg, ablate.Arm("x", budget={"steps": 7}))["steps"] == 7
    bigger = ablate.Arm("wide", pretrain={"model": {"hidden_size": 64, "intermediate_size": 256}})
    wide = ablate_measure.update_flops(cfg, bigger)
    assert wide > 2 * ablate_measure.update_flops(cfg, base)
    assert ablate_measure.budget_of(cfg, bigger)["steps"] == max(1, round(2 * ablate_measure.update_flops(cfg, base) / wide))
    # the plan holds the computed updates: a change in the base recipe reruns the FLOP-matched arm
    key = ablate.plan_key(cfg, ltr)
    cfg.pretrain["train"]["batch_size"] = 16
    assert ablate.plan_key(cfg, ltr) != key


def test_dry_run_shows_the_lr_grid_seeds_and_budgets(grid, capsys):
    from bertkit.cli import main

    path, _ = grid
    assert main(["ablate", str(path), "--dry-run"]) == 0
    rows = {r["arm"]: r for r in map(json.loads, capsys.readouterr().out.strip().splitlines())}
    assert rows["base"]["finetune"] == {"seeds": [0, 1], "lr_search": [1e-5, 3e-3], "lr_chosen_on_seeds": [0],
                                        "runs_per_task": 3}
    assert rows["fixed"]["finetune"]["lr"] == {"sst2": 2e-3} and rows["fixed"]["budget"] is None
    assert rows["base"]["budget"]["updates"] == 2 and rows["base"]["budget"]["flops_per_update"] > 0
    cfg = ablate_config.load_ablate_config(path)
    steps = ablate_measure.budget_of(cfg, cfg.arms[1])["steps"]
    assert rows["ltr_flops"]["budget"]["match"] == "flops" and rows["ltr_flops"]["budget"]["updates"] == steps
    assert rows["ltr_flops"]["changes"].get("pretrain.train.max_steps", 2) == steps


@pytest.mark.parametrize("extra, says", [
    ("lr_search: {lrs: [0.001, -1]}", "lr_search.lrs must be a list of positive"),
    ("lr_search: {lrs: [0.001, 0.001]}", "repeats a rate"), ("lr_search: {lrs: [0.001], seeds: some}", "'first' or 'all'"),
    ("lr_search: {lr: [0.001]}", "unknown key 'lr'; did you mean 'lrs'"), ("lr_search: [0.001]", "lr_search must be a mapping"),
    ("budget: {match: compute}", "g.yaml: budget.match: 'compute' is not one of tokens, time, flops")])
def test_grid_level_mistakes_are_one_line(tmp_path, extra, says):
    p = tmp_path / "g.yaml"
    p.write_text(f"tasks: {{sst2: {{}}}}\narms: [{{name: base}}]\n{extra}\n")
    with pytest.raises(BertkitError, match=says):
        ablate_config.load_ablate_config(p)


def test_arm_level_mistakes_become_the_arms_row(tmp_path):
    p = tmp_path / "g.yaml"
    p.write_text("tasks: {sst2: {}}\narms: [{name: base}, {name: a, lr_search: {lrs: [0]}}, "
                 "{name: b, budget: {match: compute}}, {name: c, budget: {match: time}}]\n")
    cfg = ablate_config.load_ablate_config(p)
    assert "lr_search.lrs" in cfg.arms[1].error and "budget.match" in cfg.arms[2].error
    rows = ablate.dry_run(cfg, cfg.arms)
    assert [r["status"] for r in rows] == ["ok", "would fail", "would fail", "would fail"]
    assert "needs budget.time" in rows[3]["error"]


# ---- statistics ----------------------------------------------------------------------------------
def test_t_quantile_and_the_welch_interval_match_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 1.7, 2, 3.4, 4, 8, 30, 1000):
        for q in (0.9, 0.975, 0.995):
            assert t_quantile(q, df) == pytest.approx(stats.t.ppf(q, df), rel=1e-9)
    r = random.Random(2)
    for _ in range(30):
        a = [r.gauss(0.8, 0.03) for _ in range(r.randint(2, 7))]
        b = [r.gauss(0.8 + r.choice([0, 0.02, 0.08]), r.uniform(0.002, 0.05)) for _ in range(r.randint(2, 7))]
        lo, hi = difference_ci(a, b)
        _, df, p = welch_t_test(a, b)
        delta = sum(a) / len(a) - sum(b) / len(b)
        se = math.sqrt(stats.tvar(a) / len(a) + stats.tvar(b) / len(b))
        assert lo == pytest.approx(delta - stats.t.ppf(0.975, df) * se, rel=1e-8)
        assert hi == pytest.approx(delta + stats.t.ppf(0.975, df) * se, rel=1e-8)
        assert (lo > 0 or hi < 0) == (p < 0.05)                        # the interval excludes 0 iff p < 0.05
    assert difference_ci([0.6, 0.6], [0.5, 0.5]) == pytest.approx((0.1, 0.1))
    assert difference_ci([0.6], [0.5, 0.5]) is None


def test_rerun_skips_and_a_new_candidate_runs_only_its_own_runs(grid):
    """(Last: it changes the grid's lr search in place.)"""
    path, _ = grid
    out = path.parent / "out"
    cfg = ablate_config.load_ablate_config(path)
    summary = ablate.run_grid(cfg, cfg.arms)
    assert summary["skipped"] == ["base", "ltr_flops", "fixed"] and summary["ran"] == []
    cfg.lr_search = {"lrs": [1e-5, 3e-3, 1e-3]}
    base, ltr, fixed = cfg.arms
    assert not ablate.finished(cfg, base) and not ablate.finished(cfg, ltr) and ablate.finished(cfg, fixed)
    before = (out / "arms" / "base" / "log.txt").read_text()
    summary = ablate.run_grid(cfg, ablate_config.select_arms(cfg, ["base"]))
    new = (out / "arms" / "base" / "log.txt").read_text()[len(before):]
    assert summary["ran"] == ["base"] and "pre-training finished before" in new
    assert new.count("ablate: arm base: fine-tuning") in (1, 2)     # the new rate's seed 0 (+ seed 1 if it wins)
    assert "fine-tuning sst2, seed 0" in new
    assert len([r for r in rows_of(out / "arms" / "base" / "results.jsonl") if r["status"] == "lr_candidate"]) == 3


def test_report_reads_an_arms_shape_from_its_model_folder(tmp_path):
    """A preset model leaves num_layers etc. None in the run card's config: the as-trained table and
    the checklist read the built shape from the arm's config.json (not 'LNone/HNone/ANone')."""
    from bertkit.ablate.cards import _shape

    model = tmp_path / "final"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 4, "hidden_size": 256,
                                                   "num_attention_heads": 4}))
    assert _shape({"model": str(model)}, {}) == "L4/H256/A4"
    assert _shape({}, {"layers": 2, "hidden_size": 128, "heads": 2}) == "L2/H128/A2"
    assert _shape({"model": str(tmp_path / "missing")}, {}) == "—"


def test_stopped_jobs_share_one_grace_period():
    """After a Ctrl-C the grid waits for its jobs together, not for each in turn, then terminates the rest."""
    import subprocess
    import time

    from bertkit.ablate import grid

    class Job:
        def __init__(self):
            self.timeouts, self.terminated = [], False

        def wait(self, timeout=None):
            self.timeouts.append(timeout)
            time.sleep(min(timeout, 0.05))
            raise subprocess.TimeoutExpired("job", timeout)

        def terminate(self):
            self.terminated = True

    jobs = [Job() for _ in range(5)]
    t0 = time.monotonic()
    grid._stop_jobs(jobs, 0.1)
    assert time.monotonic() - t0 < 0.4 and all(j.terminated for j in jobs)
    assert jobs[0].timeouts[0] > 0.05 and jobs[-1].timeouts[0] < 0.06        # what is left of one period
