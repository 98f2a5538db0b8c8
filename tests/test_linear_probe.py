"""Logistic-regression probes (`bertkit.linear_probe`, `bertkit probe`, ablate's probe arms): the fit
equals scikit-learn's LogisticRegression on the same standardised features, is deterministic, chooses
C by cross-validation on the training data only, and runs end to end on a saved tiny model."""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.finetune import FinetuneConfig
from bertkit.ablate.probes import probe_rows
from bertkit.linear_probe import (ProbeSpec, choose_c, fit_logreg, folds_of, probe, probe_spec,
                                  standardise)
from test_finetune import conll_dir, sst_dir, tiny_model  # noqa: F401  (fixtures)

pytestmark = pytest.mark.usefixtures("one_thread")    # conftest: tiny models, one thread


def blobs(n: int, d: int, k: int, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    """k overlapping Gaussian classes (not separable: a finite optimum at any C)."""
    rng = np.random.RandomState(seed)
    y = rng.randint(0, k, n)
    X = rng.normal(size=(n, d)) * rng.uniform(0.5, 3.0, d) + rng.normal(size=(k, d))[y] + 5.0
    return torch.from_numpy(X), y


@pytest.mark.parametrize("k, C", [(2, 0.05), (2, 10.0), (3, 1.0), (4, 0.1)])
def test_fit_equals_scikit_learn(k, C):
    from sklearn.linear_model import LogisticRegression

    X, y = blobs(300, 12, k, seed=k)
    Xs, = standardise(X)
    model = fit_logreg(Xs, torch.from_numpy(y), k, C, tol=1e-7, max_iter=5000)
    assert model.converged and model.grad_max <= 1e-7 and 0 < model.iterations < 5000
    ref = LogisticRegression(C=C, solver="lbfgs", tol=1e-12, max_iter=100_000).fit(Xs.numpy(), y)
    ours = model.log_proba(Xs).exp().numpy()
    np.testing.assert_allclose(ours, ref.predict_proba(Xs.numpy()), atol=1e-4, rtol=0)
    held, _ = blobs(50, 12, k, seed=10 + k)
    _, Xh = standardise(X, held)
    np.testing.assert_allclose(model.log_proba(Xh).exp().numpy(), ref.predict_proba(Xh.numpy()), atol=1e-4, rtol=0)


def test_fit_is_deterministic_and_records_non_convergence():
    X, y = blobs(200, 8, 3, seed=0)
    Xs, = standardise(X)
    a = fit_logreg(Xs, torch.from_numpy(y), 3, 1.0)
    b = fit_logreg(Xs, torch.from_numpy(y), 3, 1.0)
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias) and a.iterations == b.iterations
    short = fit_logreg(Xs, torch.from_numpy(y), 3, 1.0, max_iter=2)
    assert not short.converged and short.iterations == 2 and short.grad_max > 1e-6


def test_folds_and_the_choice_of_c():
    groups = np.array([0, 0, 1, 2, 2, 2, 3, 4, 5, 6, 7, 8, 9])
    fold = folds_of(groups, 3)
    assert np.array_equal(fold, folds_of(groups, 3))                       # fixed
    for g in np.unique(groups):                                              # an example's rows stay together
        assert len(set(fold[groups == g])) == 1
    assert sorted(np.bincount(fold[np.unique(groups, return_index=True)[1]])) == [3, 3, 4]
    with pytest.raises(BertkitError, match="at least 20"):
        folds_of(groups, 20)
    assert choose_c({0.01: 0.7, 0.1: 0.8, 1.0: 0.8, 10.0: 0.75}) == 0.1       # a tie: the stronger penalty
    assert choose_c({0.01: 0.9, 0.1: 0.8}) == 0.01
    assert choose_c({0.01: 0.7, 0.1: 0.8, 1.0: 0.85}, unconverged={1.0}) == 0.1   # a half-solved fit never wins
    assert choose_c({0.01: 0.7, 0.1: 0.8}, unconverged={0.01, 0.1}) == 0.1      # none converged: all stay eligible


def test_spec_checks():
    assert ProbeSpec(features="last, concat_last_four", C=[10, 0.1]).C == [0.1, 10.0]
    assert probe_spec({"features": ["last"], "pooling": ["mean"]}).features == ["last"]
    for raw, says in (({"featurs": ["last"]}, "did you mean 'features'"), ({"features": ["cls"]}, "choose from"),
                      ({"features": ["pooler"]}, "not a state"), ({"pooling": ["max"]}, "choose from"),
                      ({"C": [0]}, "positive"), ({"C": ["x"]}, "numbers"), ({"folds": 1}, ">= 2"),
                      ({"features": []}, "non-empty"), ("last", "mapping")):
        with pytest.raises(BertkitError, match=says):
            probe_spec(raw, "arm p probe")


def cfg(**kw) -> FinetuneConfig:
    return FinetuneConfig(**{"max_length": 32, "progress": False, **kw})


FAST = dict(C=[0.01, 1.0, 100.0], folds=3)


def test_sentence_probe_on_a_tiny_model(tiny_model, sst_dir, tmp_path):
    """Every feature x pooling of a random tiny encoder: the sentiment word survives in the mean of the
    states, [CLS] of the embeddings is left out, and the same run twice gives the same numbers."""
    spec = ProbeSpec(features=["embeddings", "last", "concat_last_2"],
                     pooling=["cls", "mean"], **FAST)
    c = cfg(task="sst2", data=str(sst_dir), model=str(tiny_model))
    result = probe(c, spec, fits_log=tmp_path / "fits.jsonl")
    assert [(p["features"], p["pooling"]) for p in result["probes"]] == [
        ("embeddings", "mean"), ("last", "cls"), ("last", "mean"), ("concat_last_2", "cls"), ("concat_last_2", "mean")]
    assert result["skipped"] and result["skipped"][0].startswith("embeddings/cls")
    assert result["metric"] == "accuracy" and result["train_examples"] == 320 and result["dev_examples"] == 80
    assert 0.3 < result["majority"]["accuracy"] < 0.7
    by = {(p["features"], p["pooling"]): p for p in result["probes"]}
    assert by[("embeddings", "mean")]["value"] >= 0.95, by
    for p in result["probes"]:
        assert p["converged"] and p["iterations"] >= 1 and p["C"] in FAST["C"]
        assert set(p["cv"]) == {"0.01", "1", "100"} and p["dev"]["accuracy"] == p["value"]
        assert p["width"] == (64 if p["features"] == "concat_last_2" else 32)
    fits = [json.loads(x) for x in (tmp_path / "fits.jsonl").read_text().splitlines()]
    assert len(fits) == 5 * (3 * 3 + 1) and {f["fold"] for f in fits} == {0, 1, 2, "all"}
    for p in result["probes"]:                      # the Cs left out of the choice are the ones some fold left unsolved
        mine = [f for f in fits if (f["features"], f["pooling"]) == (p["features"], p["pooling"]) and f["fold"] != "all"]
        assert p["cv_unconverged"] == [f"{c:g}" for c in sorted({f["C"] for f in mine if not f["converged"]})]
    assert len(result["dev_ids"]) == len(set(result["dev_ids"])) == 80
    for p in result["probes"]:                      # each dev example's outcome, adding up to the score
        o = p["outcomes"]
        assert len(o["num"]) == len(o["den"]) == 80 and o["den"] == [1] * 80 and sum(o["num"]) / 80 == p["value"]
    again = probe(c, spec)
    strip = lambda r: [{k: v for k, v in p.items() if k != "fit_wall_s"} for p in r["probes"]]
    assert strip(again) == strip(result)


def test_tagging_probe_reads_first_pieces(tiny_model, conll_dir):
    """CoNLL-style tagging: one row per word (its first piece), scored by entity-level F1."""
    spec = ProbeSpec(features=["embeddings", "last"], pooling=["mean"], **FAST)
    result = probe(cfg(task="conll2003", data=str(conll_dir), model=str(tiny_model)), spec)
    assert result["metric"] == "f1" and result["majority"]["label"] == "O" and result["majority"]["f1"] == 0.0
    assert result["train_rows"] > result["train_examples"] * 5            # ~6 words per sentence
    assert [p["pooling"] for p in result["probes"]] == [None, None] and not result["skipped"]
    assert max(p["value"] for p in result["probes"]) > 0.9, result["probes"]
    for p in result["probes"]:                      # per sentence: 2 x entities right, predicted + true entities
        num, den = p["outcomes"]["num"], p["outcomes"]["den"]
        assert len(num) == len(den) == result["dev_examples"] and sum(num) / sum(den) == pytest.approx(p["value"])


def noisy_tags(rng, tags: list[str]) -> list[str]:
    """A tagger's mistakes: whole entities given the wrong type, single words mistagged (cutting or
    stretching entities, inventing ones)."""
    out = list(tags)
    for i, t in enumerate(tags):
        if t.startswith("B-") and rng.random() < 0.15:
            other = rng.choice([x for x in ("PER", "LOC", "ORG", "MISC") if x != t[2:]])
            j = i
            while j < len(tags) and (j == i or tags[j] == "I-" + t[2:]):
                out[j] = tags[j][:2] + other
                j += 1
        elif rng.random() < 0.05:
            out[i] = rng.choice(["O", "B-PER", "I-PER", "B-ORG", "I-LOC", "B-MISC"])
    return out


def test_dev_outcomes_add_up_to_the_tasks_own_metric(shared_data):
    """Real dev sets with a plausible system's mistakes: the per-example (num, den) of SST-2 accuracy, MRPC
    F1 of class 1 and CoNLL-2003 entity F1 sum to the task's own metric; CoLA's MCC has none."""
    import random

    from bertkit.linear_probe import dev_outcomes
    from bertkit.tasks.glue import COLA, MRPC, SST2
    from bertkit.tasks.ner import CONLL2003

    rng = random.Random(0)
    conll = CONLL2003.read(shared_data / "conll2003" / "valid.txt.gz")
    predictions = {ex.id: noisy_tags(rng, ex.tags) for ex in conll}
    o = dev_outcomes(CONLL2003, predictions, conll)
    f1 = CONLL2003.metrics(predictions, conll)["f1"]
    assert len(o["num"]) == len(conll) == 3250 and 0.6 < f1 < 0.95
    assert sum(o["num"]) / sum(o["den"]) == pytest.approx(f1, rel=1e-12)
    for task, folder in ((SST2, "SST-2"), (MRPC, "MRPC"), (COLA, "CoLA")):
        examples = task.read(shared_data / "glue" / folder / "dev.tsv.gz")
        predictions = {ex.id: ex.label if rng.random() < 0.75 else rng.choice("01") for ex in examples}
        o = dev_outcomes(task, predictions, examples)
        if task is COLA:
            assert o is None
            continue
        want = task.metrics(predictions, examples)[task.main_metric]
        assert len(o["num"]) == len(examples) and sum(o["num"]) / sum(o["den"]) == pytest.approx(want, rel=1e-12)


def test_cli_table_results_and_one_line_errors(tiny_model, sst_dir, tmp_path, capsys):
    out = tmp_path / "p"
    args = ["probe", "--model", str(tiny_model), "--task", "sst2", "--data", str(sst_dir), "--features",
            "embeddings,last", "--C", "0.01,1,100", "--folds", "3", "--max-length", "32", "--out", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "majority class" in text and "dev accuracy" in text and "left out: embeddings/cls" in text
    assert re.search(r"^last\s+cls\s+[01]\.\d{4}\s", text, re.M) and f"wrote {out / 'results.json'}" in text, text
    saved = json.loads((out / "results.json").read_text())
    assert len(saved["probes"]) == 3 and (out / "fits.jsonl").is_file()
    assert all(len(p["outcomes"]["num"]) == saved["dev_examples"] for p in saved["probes"])
    assert '"outcomes": {"num": [' in (out / "results.json").read_text()       # one line per list
    for extra, says in ((["--features", "bogus"], "choose from"), (["--pooling", "max"], "choose from"),
                        (["--folds", "1"], ">= 2"), (["--C", "-1"], "positive"), (["--task", "squad"], "classification"),
                        (["--task", "stsb"], "regression"), (["--model", str(tmp_path / "none")], "no such folder"),
                        (["--features", "concat_last_four"], "the model has 2 layers"),
                        (["--data", str(tmp_path / "nodata")], "no such file")):
        code = main(args[:1] + [a for a in _replace(args[1:], extra)])
        err = capsys.readouterr().err
        assert code == 1 and says in err and err.count("\n") == 1, (extra, err)


def _replace(args: list[str], extra: list[str]) -> list[str]:
    """`args` with the option of `extra` set to its value (added when absent)."""
    out = list(args)
    if extra[0] in out:
        out[out.index(extra[0]) + 1] = extra[1]
    else:
        out += extra
    return out


def test_ablate_probe_rows_are_reused_until_the_data_changes(tiny_model, sst_dir, tmp_path):
    arm = SimpleNamespace(name="probe_lbfgs", probe={"features": ["last"], "pooling": ["cls", "mean"], **FAST})
    c = cfg(task="sst2", data=str(sst_dir), model=str(tiny_model), out=str(tmp_path / "probe" / "sst2"))
    pre = {"tokens": 100, "updates": 3, "wall_s": 1.0}
    rows = probe_rows(arm, c, pre, [["model.safetensors", 1, 2]], "frozen base, L-BFGS probes")
    assert [(r["probe_features"], r["probe_pooling"], r["variant"]) for r in rows] == [
        ("last", "cls", "last/cls"), ("last", "mean", "last/mean")]
    r = rows[0]
    assert r["arm"] == "probe_lbfgs" and r["seed"] == 0 and r["status"] == "ok" and r["frozen"] and r["probe"] == "lbfgs"
    assert r["value"] == r["best"] and r["metric"] == "accuracy" and r["pretrain_updates"] == 3 and r["converged"]
    mtime = (tmp_path / "probe" / "sst2" / "results.json").stat().st_mtime_ns
    assert not (tmp_path / "probe" / "sst2" / "finished.jsonl").exists()       # the resume file goes with results.json
    assert probe_rows(arm, c, pre, [["model.safetensors", 1, 2]], "x")[0]["value"] == r["value"]
    assert (tmp_path / "probe" / "sst2" / "results.json").stat().st_mtime_ns == mtime          # reused
    c2 = cfg(task="sst2", data=str(sst_dir), model=str(tiny_model), out=c.out, train_limit=200)
    assert probe_rows(arm, c2, pre, [["model.safetensors", 1, 2]], "x")[0]["train_examples"] == 200   # redone


def probe_grid() -> str:
    """test_ablate's micro grid with a base arm, a probe arm over it and a probe arm with a typo."""
    from test_ablate import MICRO

    return MICRO.split("arms:\n")[0] + """arms:
  - {{name: base}}
  - {{name: probe_lbfgs, model_from: base, probe: {{features: [embeddings, last], pooling: [cls, mean], folds: 3,
                                                    C: [0.1, 10]}}}}
  - {{name: probe_typo, model_from: base, probe: {{featurs: [last]}}}}
"""


def test_ablate_probe_arm(tmp_path):
    """A probe arm over the base model: one row per task x feature x pooling (seed 0), none for the left-out
    embeddings/cls; a mistyped probe key is that arm's one-line failure, found when the grid is read."""
    from importlib import resources

    from bertkit import ablate

    from bertkit.ablate import config as ablate_config
    from test_ablate import write_tasks

    write_tasks(tmp_path / "data")
    corpus = resources.files("bertkit") / "sample" / "inaugural.txt.gz"
    path = tmp_path / "grid.yaml"
    path.write_text(probe_grid().format(out=tmp_path / "out", data=tmp_path / "data", corpus=corpus), encoding="utf-8")
    cfg = ablate_config.load_ablate_config(path)
    typo = cfg.arms[2]
    assert "probe: unknown key 'featurs'; did you mean 'features'?" in typo.error
    assert [r["status"] for r in ablate.dry_run(cfg, cfg.arms)] == ["ok", "ok", "would fail"]
    summary = ablate.run_grid(cfg, cfg.arms[:2])
    assert summary["failed"] == []
    rows = [json.loads(x) for x in (tmp_path / "out" / "arms" / "probe_lbfgs" / "results.jsonl").read_text().splitlines()]
    assert [(r["task"], r["variant"]) for r in rows] == [("sst2", "embeddings/mean"), ("sst2", "last/cls"),
                                                         ("sst2", "last/mean"), ("conll2003", "embeddings"),
                                                         ("conll2003", "last")]
    assert all(r["seed"] == 0 and r["status"] == "ok" and r["probe"] == "lbfgs" and r["C"] in (0.1, 10.0)
               and r["converged"] and 0 <= r["value"] <= 1 and "mlm_accuracy" in r for r in rows)
    assert (tmp_path / "out" / "arms" / "probe_lbfgs" / "probe" / "conll2003" / "fits.jsonl").is_file()
    assert "probe features=['embeddings', 'last']" in ablate_config.describe(cfg.arms[1])
    from bertkit.ablate.report import write_report
    report = write_report(cfg).read_text()
    assert "## Frozen-feature probes" in report and "| task | features | probe_lbfgs (base) | majority |" in report
    line = next(x for x in report.splitlines() if x.startswith("| sst2 | last/cls |"))
    assert f"{rows[1]['value']:.3f} (C {rows[1]['C']:g})" in line          # one row per variant, not seeds
    assert not any(x.startswith("| probe_lbfgs |") and "±" in x for x in report.splitlines())
    cfg.lr_search = {"lrs": [1e-3, 2e-3]}
    assert ablate_config.lr_search_of(cfg, cfg.arms[1]) is None           # a probe has no learning rate to search
    assert ablate_config.lr_search_of(cfg, cfg.arms[0])["lrs"] == [1e-3, 2e-3]


def test_an_interrupted_probe_run_resumes_at_the_probe_it_was_on(tiny_model, sst_dir, tmp_path, monkeypatch):
    """probe(finished=...): the probes fitted before an interruption are reused, not fitted again, the
    one cut short is fitted again, and the result and fits.jsonl equal those of an uninterrupted run."""
    import bertkit.linear_probe as lp
    spec = ProbeSpec(features=["embeddings", "last"], pooling=["mean"], **FAST)
    c = cfg(task="sst2", data=str(sst_dir), model=str(tiny_model))
    whole = probe(c, spec, fits_log=tmp_path / "whole.jsonl")
    real, fitted = lp._one_probe, []

    def interrupted(task, labels, train, dev, features, pooling, *rest):
        if features == "last":                    # the second probe: cut short after two of its fits
            report = rest[-1]
            report({"fold": 0, "C": 0.01, "score": 0.5})
            report({"fold": 0, "C": 1.0, "score": 0.5})
            raise KeyboardInterrupt
        fitted.append(features)
        return real(task, labels, train, dev, features, pooling, *rest)

    done, fits = tmp_path / "finished.jsonl", tmp_path / "fits.jsonl"
    monkeypatch.setattr(lp, "_one_probe", interrupted)
    with pytest.raises(KeyboardInterrupt):
        probe(c, spec, fits_log=fits, finished=done, key="k1")
    assert fitted == ["embeddings"] and len(done.read_text().splitlines()) == 1
    with open(done, "a") as f:
        f.write('{"key": "k1", "probe": {"feat')  # a line cut short by the interruption: ignored

    def counted(task, labels, train, dev, features, pooling, *rest):
        fitted.append(features)
        return real(task, labels, train, dev, features, pooling, *rest)
    monkeypatch.setattr(lp, "_one_probe", counted)
    resumed = probe(c, spec, fits_log=fits, finished=done, key="k1")
    assert fitted == ["embeddings", "last"]                       # the first probe was not fitted again
    strip = lambda r: [{k: v for k, v in p.items() if k != "fit_wall_s"} for p in r["probes"]]
    assert strip(resumed) == strip(whole)
    drop = lambda path: [{k: v for k, v in json.loads(x).items() if k != "wall_s"} for x in path.read_text().splitlines()]
    assert drop(fits) == drop(tmp_path / "whole.jsonl")           # the cut-short probe's fits are not kept twice
    assert [json.loads(x)["probe"]["features"] for x in done.read_text().splitlines()] == ["embeddings", "last"]
    fitted.clear()
    probe(c, spec, finished=done, key="k2")                       # another key: nothing reused
    assert fitted == ["embeddings", "last"]
