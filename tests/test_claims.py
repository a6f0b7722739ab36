"""claims.md: every claim decided by its rule from run records. Synthetic records (no training)
check each verdict, the pooling of seeds, metric paths and intervals, the safe rule evaluator,
bad rules files and arguments (one line, exit 2, nothing written), and the shipped
conf/papers/<paper>/claims.yaml against the committed records."""
import dataclasses
import itertools
import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from bench.reports.claims import render as claims_mod
from bench.cli.main import main
from bench.reports.claims import Interval, Rule, decide_all, load_claims, write_claims
from bench.reports.claims.rules import NO_INTERVAL
from bench.reports.claims.spec import default_rules
from bench.config import ConfigError, choices, compose, load_suite
from bench.reports.selection import select_runs
from bench.records.store import SCHEMA
from tasks.stats import across_seeds

REPO = Path(__file__).resolve().parents[1]
_ids = itertools.count()

CONV = ["task=markov", "trainer.max_steps=1000", "trainer.lr=0.01"]
MAMBA = [*CONV, "model=mamba"]
NOCONV = [*CONV, "model=mamba", "model.conv=false"]


def record(selector: list[str], seed: int = 0, gap: float = 0.001, stamp="20260101-120000",
           origin="suite:leaderboard", commit="a" * 40, **extra) -> dict:
    """An `ok` record of the run `selector` composes to, with everything the leaderboard reads;
    its task/model/trainer configs are the composed ones, so selectors match it exactly."""
    config = compose(selector)
    loss = {"bayes": 0.5, "unigram": 0.58, "model": 0.5 + gap}
    rec = {"schema": SCHEMA,
           "run_id": f"{config.task_name}--{config.model_name}--s{seed}--{stamp}-{next(_ids):06x}",
           **config.describe(), "seed": seed, "origin": origin,
           "provenance": {"commit": commit, "dirty": False}, "status": "ok",
           "params": 100, "state_size": 16,
           "train": {"steps": config.trainer.max_steps, "wall_time_s": 1.0},
           "metrics": {"gap_reference": "bayes", "gap_reference_role": "bayes", "loss": loss,
                       "gap": {k: v - 0.5 for k, v in loss.items()},
                       "gap_ci": {k: [v - 0.51, v - 0.49] for k, v in loss.items()},
                       "loss_ci": {k: [v - 0.01, v + 0.01] for k, v in loss.items()},
                       "roles": {"bayes": "bayes", "unigram": "baseline"},
                       "accuracy": {"model": 0.7, "bayes": 0.71},
                       "bayes_gap": gap, "bayes_gap_ci": sorted([gap * 0.8, gap * 1.2]),
                       "relative_gap": gap / 0.5, "sequences": 64,
                       "task": {"excess": {"model": [0.4, 0.2, 0.1]},
                                "excess_stderr": {"model": [0.1, 0.05, 0.01]},
                                "slope": {"model": None}}},
           "per_position": {"gap.model": [gap] * 4,
                            "accuracy.model": [0.1, None, 0.3, 0.5, None]}}
    for key, value in extra.items():
        rec[key] = value
    return rec


def put(directory: Path, *recs: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for rec in recs:
        (directory / f"{rec['run_id']}.json").write_text(json.dumps(rec))


RULES = """\
paper: "000"
title: A test paper
claims:
  - id: t-conv
    section: "Fig. 3a"
    claim: Convolution is the key.
    paper_number: fails without it
    where: [task=markov, trainer.max_steps=1000, trainer.lr=0.01]
    measure:
      mamba: {{where: [model=mamba]}}
      noconv: {{where: [model=mamba, model.conv=false]}}
    control: "{control}"
    rule: "{rule}"
    scale: {scale}
{extra}    command: python -m bench suite name=leaderboard
"""


def rules_file(tmp_path: Path, rule="mamba <= 0.01 and noconv >= 5 * mamba", scale="paper",
               extra="", control="mamba <= 0.05") -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES.format(rule=rule, scale=scale, extra=extra, control=control))
    return path


def decide(out_dir: Path, rules: Path, include="suite"):
    return decide_all(load_claims(rules), select_runs(str(out_dir), include))


# ------------------------------------------------------------------------ verdicts

def test_a_claim_that_holds_and_one_that_fails(tmp_path):
    put(tmp_path / "ok", record(MAMBA, gap=0.001), record(NOCONV, gap=0.06))
    [d] = decide(tmp_path / "ok", rules_file(tmp_path))
    assert d.verdict == "holds" and d.values["mamba"].value == pytest.approx(0.001)
    # a record set that should fail the claim does: without convolution it learned as well
    put(tmp_path / "bad", record(MAMBA, gap=0.001), record(NOCONV, gap=0.002))
    [d] = decide(tmp_path / "bad", rules_file(tmp_path))
    assert d.verdict == "fails"
    assert d.values["noconv"].value == pytest.approx(0.002)


def test_a_control_that_did_not_train_is_not_reached_never_fails(tmp_path):
    """The rule would fail (noconv learned as well as mamba), but the positive control (mamba
    learns) did not hold: at reduced scale that is `not reached`, at the paper's `undecided`."""
    out = tmp_path / "r"
    put(out, record(MAMBA, gap=0.2), record(NOCONV, gap=0.2))
    [d] = decide(out, rules_file(tmp_path, scale="cpu"))
    assert d.verdict == "not reached at reduced scale" and d.control is False
    assert d.note == "control did not hold"
    [d] = decide(out, rules_file(tmp_path, scale="paper"))
    assert d.verdict == "undecided" and d.control is False


def test_a_partial_rerun_by_newer_code_never_turns_a_decided_claim_undecided(tmp_path):
    """Three seeds by older code decide the claim; two seeds by newer code (the same gaps)
    would leave the t-interval too wide: the verdict keeps the older row until the newer one
    has as many seeds, then uses the newer."""
    out = tmp_path / "r"
    seeds = [(0, 0.001, 0.080), (1, 0.004, 0.079), (2, 0.002, 0.081)]
    put(out, *(record(MAMBA, seed=s, gap=g, stamp="20260101-100000") for s, g, _ in seeds),
        *(record(NOCONV, seed=s, gap=n, stamp="20260101-100000") for s, _, n in seeds))
    [before] = decide(out, rules_file(tmp_path))
    assert before.verdict == "holds" and before.values["mamba"].seeds == [0, 1, 2]
    newer = dict(commit="b" * 40, stamp="20260102-100000")
    put(out, *(record(MAMBA, seed=s, gap=g, **newer) for s, g, _ in seeds[:2]),
        *(record(NOCONV, seed=s, gap=n, **newer) for s, _, n in seeds[:2]))
    [after] = decide(out, rules_file(tmp_path))
    assert after.verdict == "holds" and after.values["mamba"].seeds == [0, 1, 2]
    assert after.values["mamba"].code == "aaaaaaa"
    alone = tmp_path / "alone"  # what the newer two seeds decide by themselves
    put(alone, *(record(MAMBA, seed=s, gap=g, **newer) for s, g, _ in seeds[:2]),
        *(record(NOCONV, seed=s, gap=n, **newer) for s, _, n in seeds[:2]))
    assert decide(alone, rules_file(tmp_path))[0].verdict == "undecided"
    put(out, record(MAMBA, seed=2, gap=0.002, **newer), record(NOCONV, seed=2, gap=0.081, **newer))
    [complete] = decide(out, rules_file(tmp_path))
    assert complete.verdict == "holds" and complete.values["mamba"].code == "bbbbbbb"


def test_overlapping_intervals_are_undecided(tmp_path):
    """noconv >= 5 x mamba on the means (0.0051 vs 0.005), but their intervals overlap."""
    out = tmp_path / "r"
    put(out, record(MAMBA, gap=0.001), record(NOCONV, gap=0.0051))
    [d] = decide(out, rules_file(tmp_path))
    assert d.verdict == "undecided"
    assert d.note == "the interval of a difference holds 0 (`noconv >= 5 * mamba`)"
    # apart, the same comparison decides
    put(tmp_path / "apart", record(MAMBA, gap=0.001), record(NOCONV, gap=0.0081))
    [d] = decide(tmp_path / "apart", rules_file(tmp_path))
    assert d.verdict == "holds"


def test_an_attainment_not_reached_at_reduced_scale_is_no_evidence(tmp_path):
    """A claim that a model reaches a level (kind: attainment) holds or is not reached at our
    reduced budget; at the paper's scale not reaching it fails."""
    out = tmp_path / "r"
    put(out, record(MAMBA, gap=0.03), record(NOCONV, gap=0.06))
    attained = 'kind: attainment\n    rule: "mamba <= 0.01"'
    for scale, verdict in (("cpu", "not reached at reduced scale"), ("paper", "fails")):
        rules = rules_file(tmp_path, scale=scale)
        rules.write_text(rules.read_text().replace('    control: "mamba <= 0.05"\n', "").replace(
            'rule: "mamba <= 0.01 and noconv >= 5 * mamba"', attained))
        [d] = decide(out, rules)
        assert d.verdict == verdict


def test_a_claim_about_trained_models_needs_a_control(tmp_path):
    rules = rules_file(tmp_path)
    rules.write_text(rules.read_text().replace('    control: "mamba <= 0.05"\n', ""))
    with pytest.raises(ConfigError, match="needs a control"):
        load_claims(rules)


@pytest.mark.parametrize("extra, rule, needle", [
    ("    control_seed: noconv\n", "noconv >= 0.05", "control_seed must name a trained model's "
     "quantity of the control \\(mamba\\) that the rule does not read, got 'noconv'"),
    ("    control_seed: [mamba]\n", "mamba <= 0.01 and noconv >= 5 * mamba",
     "that the rule does not read, got 'mamba'"),  # a rule on stalled seeds would be trivial
    ("    control_seed: mamba\n    per_seed: true\n", "noconv >= 0.05",
     "a claim judged on every seed"),
])
def test_control_seed_names_a_model_of_the_control(tmp_path, extra, rule, needle):
    with pytest.raises(ConfigError, match=needle):
        load_claims(rules_file(tmp_path, rule=rule, extra=extra))
    for valid in ("mamba", "[mamba]"):
        [claim] = load_claims(rules_file(tmp_path, rule="noconv >= 0.05",
                                         extra=f"    control_seed: {valid}\n"))
        assert claim.control_seed == ("mamba",)


@pytest.mark.parametrize("extra, rule, needle", [
    # a trained claim judged on one seed: only a model's level, never a model against a model
    ("    judge_seed: noconv\n", "noconv >= 5 * mamba", "judge_seed on a trained claim is for a "
     "model that does not reach a level"),
    ("    judge_seed: noconv\n", "noconv >= 0.05 or mamba <= 0.01", "joined by and"),
    ("    kind: attainment\n    judge_seed: mamba\n    per_seed: true\n", "mamba <= 0.01",
     "not with per_seed, nor an attainment's control_seed"),
    ("    kind: attainment\n    judge_seed: noconv\n", "mamba <= 0.01",
     "judge_seed must name a trained model's quantity of the rule \\(mamba\\), got 'noconv'"),
    ("    judge_seed: [noconv, mamba]\n    control_seed: mamba\n", "noconv >= 0.05",
     "got 'mamba'"),  # not read by the rule, and the control's own seed
])
def test_judge_seed_names_a_model_judged_on_its_best_run(tmp_path, extra, rule, needle):
    with pytest.raises(ConfigError, match=needle):
        load_claims(rules_file(tmp_path, rule=rule, extra=extra))
    [claim] = load_claims(rules_file(tmp_path, rule="mamba <= 0.01",
                                     extra="    kind: attainment\n    judge_seed: mamba\n"))
    assert claim.judge_seed == ("mamba",) and not claim.per_seed
    [claim] = load_claims(rules_file(tmp_path, rule="min(mamba, noconv) <= 0.01",
                                     extra="    kind: attainment\n"
                                           "    judge_seed: [mamba, noconv]\n"))
    assert claim.judge_seed == ("mamba", "noconv")
    [claim] = load_claims(rules_file(tmp_path, rule="noconv >= 0.05 and noconv >= 0.04",
                                     extra="    judge_seed: noconv\n    control_seed: mamba\n"))
    assert claim.judge_seed == ("noconv",) and claim.control_seed == ("mamba",)


@pytest.mark.parametrize("curve, ended", [
    ([[0, 5.0]], 5.0),  # one point: itself
    ([[i * 10, float(i)] for i in range(20)], 18.5),  # the last tenth: the mean of 18 and 19
    ([[0, 4.0], [10, "NaN"], [20, 2.0]], 2.0),  # a non-finite loss is no point of the curve
    ([[0, 4], [10, 3]], 3.0),  # integers, as JSON may parse a loss: the fast path
    ([[0, 4.0], [10, True]], 4.0), ([[0, 4.0], [10, None]], 4.0),  # no number: no point
    ([[0, 4.0], [10, 3.0, 1]], 4.0), ([[0, 4.0], 3.0], 4.0),  # not a [step, loss] pair
    ([[0, 4.0], [10, math.inf]], 4.0),  # a non-finite float on the fast path
    ([], None), (None, None)])
def test_final_training_loss_is_the_mean_of_the_curves_last_tenth(curve, ended):
    from bench.reports.claims.verdicts import final_train_loss
    rec = {"train": {"loss_curve": curve}} if curve is not None else {"train": {}}
    assert final_train_loss(rec) == (pytest.approx(ended) if ended is not None else None)


def test_missing_records_are_not_measured_and_say_which(tmp_path):
    put(tmp_path / "r", record(MAMBA, gap=0.001))
    [d] = decide(tmp_path / "r", rules_file(tmp_path))
    assert d.verdict == "not measured" and d.missing == ["noconv"]
    assert "no record of `noconv`" in claims_mod.ours_cell(d)
    # a record of another config (another budget) does not stand in for it
    put(tmp_path / "r", record(["task=markov", "trainer.max_steps=999", "trainer.lr=0.01",
                                "model=mamba", "model.conv=false"]))
    [d] = decide(tmp_path / "r", rules_file(tmp_path))
    assert d.verdict == "not measured"


def test_cpu_scale_records_of_a_gpu_scale_claim(tmp_path):
    """scale: cpu -> `holds at reduced scale`; paper_scale selectors prefer paper-scale
    records (trainer=paper replaces the CPU budget) once they exist for every quantity."""
    out = tmp_path / "r"
    put(out, record(MAMBA, gap=0.001), record(NOCONV, gap=0.06))
    rules = rules_file(tmp_path, scale="cpu", extra="    paper_scale: [trainer=paper]\n")
    [d] = decide(out, rules)
    assert d.verdict == "holds at reduced scale" and d.scale == "cpu"
    put(out, record(["task=markov", "model=mamba", "trainer=paper"], gap=0.0005))
    [d] = decide(out, rules)  # only one quantity at paper scale: still the CPU records
    assert d.verdict == "holds at reduced scale"
    put(out, record(["task=markov", "model=mamba", "model.conv=false", "trainer=paper"],
                    gap=0.0006))
    [d] = decide(out, rules)  # paper scale, and there the rule fails
    assert d.scale == "paper" and d.verdict == "fails"
    assert d.values["noconv"].value == pytest.approx(0.0006)


def test_seeds_are_pooled_each_once_with_a_t_interval(tmp_path):
    out = tmp_path / "r"
    gaps = {0: 0.001, 1: 0.003, 2: 0.002}
    put(out, *(record(MAMBA, seed=s, gap=g, stamp="20260101-120000") for s, g in gaps.items()),
        # an older copy of seed 1 that disagrees; on it the verdict would be the same (where it
        # is not, the claim is undecided: test_a_verdict_that_rests_on_which_draw_...)
        record(MAMBA, seed=1, gap=0.0035, stamp="20250101-120000"),
        record(NOCONV, gap=0.06))
    [d] = decide(out, rules_file(tmp_path))
    m = d.values["mamba"]
    assert m.seeds == [0, 1, 2] and m.across_seeds
    mean, half = across_seeds(list(gaps.values()))
    assert m.value == pytest.approx(mean)
    assert m.interval == pytest.approx((mean - half, mean + half))
    assert d.verdict == "holds"
    # one seed: the record's own bootstrap interval
    assert d.values["noconv"].interval == pytest.approx((0.048, 0.072))
    assert not d.values["noconv"].across_seeds


def test_the_newest_code_version_is_used_and_origin_filters(tmp_path):
    out = tmp_path / "r"
    put(out, record(MAMBA, gap=0.001, commit="a" * 40, stamp="20260101-120000"),
        record(MAMBA, gap=0.009, commit="b" * 40, stamp="20260201-120000"),
        record(NOCONV, gap=0.06),
        record(NOCONV, gap=0.5, origin="adhoc", stamp="20260301-120000"))
    [d] = decide(out, rules_file(tmp_path))
    assert d.values["mamba"].value == pytest.approx(0.009) and d.values["mamba"].code == "bbbbbbb"
    assert d.values["noconv"].value == pytest.approx(0.06)  # the ad-hoc run is left out
    [d] = decide(out, rules_file(tmp_path), include="all")
    assert d.values["noconv"].value == pytest.approx(0.5)  # now the newest record of seed 0


H100 = {"device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3", "kernel": "mamba_ssm",
        "precision": "32-true", "compile": False, "tf32": False}


def on_gpu(selector: list[str], **kwargs) -> dict:
    rec = record(selector, **kwargs)
    rec["train"].update(H100)
    return rec


def test_a_claim_never_pools_or_compares_cpu_and_gpu_records(tmp_path):
    """All numbers of a claim come from one machine: the one with records of the most
    quantities, then the most seeds, then the newest; the row names a GPU, not the CPU."""
    out = tmp_path / "r"
    put(out, record(MAMBA, seed=0, gap=0.001), record(MAMBA, seed=1, gap=0.001),
        record(NOCONV, gap=0.06), on_gpu(MAMBA, seed=0, gap=0.5, stamp="20260201-120000"))
    [d] = decide(out, rules_file(tmp_path))  # a newer GPU seed displaces nothing
    assert d.values["mamba"].seeds == [0, 1] and d.values["mamba"].value == pytest.approx(0.001)
    assert d.verdict == "holds" and "trained on" not in claims_mod.ours_cell(d)
    put(out, on_gpu(MAMBA, seed=1, gap=0.5, stamp="20260201-120000"))
    [d] = decide(out, rules_file(tmp_path))  # as many seeds, but noconv only on the CPU
    assert d.values["mamba"].value == pytest.approx(0.001) and d.machine.device == "cpu"
    put(out, on_gpu(NOCONV, gap=0.5, stamp="20260201-120000"))
    [d] = decide(out, rules_file(tmp_path))  # both on each: as many seeds, the GPU's are newer
    # there mamba did not learn (its control fails): no verdict either way
    assert d.machine.device == "cuda: NVIDIA H100 80GB HBM3" and d.verdict == "undecided"
    assert d.values["mamba"].value == pytest.approx(0.5) and d.values["mamba"].seeds == [0, 1]
    assert ("*paper scale, code aaaaaaa, trained on [cuda: NVIDIA H100 80GB HBM3] with SSD kernel "
            "mamba_ssm*") in claims_mod.ours_cell(d)
    # one quantity only on the GPU, the other only on the CPU: nothing to compare
    put(tmp_path / "split", record(NOCONV, gap=0.06),
        on_gpu(MAMBA, gap=0.001, stamp="20260201-120000"))
    [d] = decide(tmp_path / "split", rules_file(tmp_path))
    assert d.verdict == "not measured" and d.missing == ["noconv"]
    assert "*trained on [cuda: NVIDIA H100 80GB HBM3] with SSD kernel mamba_ssm*" in (
        claims_mod.ours_cell(d))


def test_a_record_that_predates_a_config_field_matches_its_default(tmp_path):
    old = record(MAMBA, gap=0.001)
    del old["model"]["config"]["tie_embeddings"]  # the field did not exist when it ran
    del old["trainer"]["config"]["compile"]
    put(tmp_path / "r", old, record(NOCONV, gap=0.06))
    [d] = decide(tmp_path / "r", rules_file(tmp_path))
    assert d.verdict == "holds"


def test_metric_paths_indices_slices_and_intervals(tmp_path):
    out = tmp_path / "r"
    put(out, record(MAMBA, gap=0.001), record(NOCONV, gap=0.06))
    extra = "\n".join([
        "  - id: t-paths", "    section: s", "    claim: c", "    paper_number: p",
        "    where: [task=markov, model=mamba, trainer.max_steps=1000, trainer.lr=0.01]",
        "    measure:",
        "      loss: {metric: metrics.loss.model}",
        "      acc: {metric: metrics.accuracy.model}",
        "      last: {metric: 'per_position.accuracy.model[last]'}",
        "      window: {metric: 'per_position.accuracy.model[0:3]'}",
        "      second: {metric: 'metrics.task.excess.model[1]'}",
        "      slope: {metric: metrics.task.slope.model}",
        "    kind: attainment",
        "    rule: \"loss > 0 and acc > 0 and last > 0 and window > 0 and second > 0\"",
        "    scale: paper", "    command: python -m bench suite name=leaderboard", ""])
    rules = rules_file(tmp_path)
    rules.write_text(rules.read_text() + extra)
    _, d = decide(out, rules)
    v = d.values
    assert v["loss"].value == pytest.approx(0.501) and v["loss"].interval == pytest.approx(
        (0.491, 0.511))  # metrics.loss_ci.model
    assert v["acc"].value == 0.7 and v["acc"].interval is None
    assert v["last"].value == 0.5  # the last number, None entries skipped
    assert v["window"].value == pytest.approx(0.2)  # mean of 0.1 and 0.3
    assert v["second"].value == 0.2 and v["second"].interval == pytest.approx(
        (0.2 - 1.96 * 0.05, 0.2 + 1.96 * 0.05))  # ±1.96 x excess_stderr
    assert math.isnan(v["slope"].value)  # slope is not in the rule
    # acc, last and window have no interval in these records: their noise is unknown, so the
    # comparisons that read them decide nothing
    assert d.verdict == "undecided"
    assert [t.text for t in d.tests if t.why.startswith(NO_INTERVAL)] == [
        "acc > 0", "last > 0", "window > 0"]
    # records that carry them: accuracy_ci, and the curves' standard errors beside them
    with_errors = record(MAMBA, gap=0.001)
    with_errors["metrics"]["accuracy_ci"] = {"model": [0.68, 0.72], "bayes": [0.69, 0.73]}
    with_errors["per_position_stderr"] = {"accuracy.model": [0.01, None, 0.03, 0.02, None]}
    put(tmp_path / "r2", with_errors, record(NOCONV, gap=0.06))
    _, d = decide(tmp_path / "r2", rules)
    v = d.values
    assert v["acc"].interval == (0.68, 0.72)
    assert v["last"].interval == pytest.approx((0.5 - 1.96 * 0.02, 0.5 + 1.96 * 0.02))
    # a slice's mean: its standard error is at most the mean of the positions' (0.01, 0.03)
    assert v["window"].interval == pytest.approx((0.2 - 1.96 * 0.02, 0.2 + 1.96 * 0.02))
    assert d.verdict == "holds"


def test_undefined_or_non_finite_numbers_are_undecided_never_fails(tmp_path):
    out = tmp_path / "r"
    put(out, record(MAMBA, gap=0.0), record(NOCONV, gap=0.06))
    [d] = decide(out, rules_file(tmp_path, rule="noconv / mamba >= 5"))
    assert d.verdict == "undecided" and "division by an interval that holds 0" in d.note
    nan = record(MAMBA, gap=0.001)
    nan["metrics"]["accuracy"]["model"] = "NaN"  # how records store a non-finite number
    put(tmp_path / "n", nan, record(NOCONV, gap=0.06))
    rules = rules_file(tmp_path, rule="mamba <= 1 and noconv > 0")
    rules.write_text(rules.read_text().replace(
        "{where: [model=mamba]}", "{where: [model=mamba], metric: metrics.accuracy.model}"))
    [d] = decide(tmp_path / "n", rules)
    assert d.verdict == "undecided" and "not a number: mamba" in d.note


def test_a_claim_that_needs_a_protocol_stays_not_measured(tmp_path):
    put(tmp_path / "r", record(MAMBA, gap=0.001), record(NOCONV, gap=0.06))
    rules = rules_file(tmp_path, extra="    needs: a probe of a_t\n")
    [d] = decide(tmp_path / "r", rules)
    assert d.verdict == "not measured" and d.note == "needs a probe of a_t"


# ------------------------------------------------------------------------ the rule language

@pytest.mark.parametrize("rule, needle", [
    ("__import__('os')", "calls other than abs, min, max"),
    ("__import__('os').system == 0", "attribute access"),
    ("__import__('os').system('true') == 0", "calls other than abs, min, max"),
    ("mamba.real > 0", "attribute access"),
    ("open('x') == 1", "calls other than abs, min, max"),
    ("abs(x=mamba) > 0", "plain positional"),
    ("min(mamba) > 0", "2 or more"),
    ("mamba ** 2 > 0", "Pow"),
    ("mamba // 2 > 0", "FloorDiv"),
    ("[mamba][0] > 0", "not allowed"),
    ("(lambda: 1)() > 0", "calls other than"),
    ("mamba if noconv else 0", "not allowed"),
    ("mamba in [1]", "only the comparisons"),
    ("'a' < 'b'", "not a number"),
    ("True", "not a number"),
    ("mamba + 1", "must be a comparison"),
    ("(mamba < 1) + 1 > 0", "arithmetic needs a number"),
    ("not mamba", "not needs a comparison"),
    ("gd7 < 1", "names 'gd7', which is not one of its quantities"),
    ("mamba <", "not an expression"),
    ("abs > 1", "must be called"),
])
def test_the_evaluator_refuses_anything_outside_the_language(rule, needle):
    with pytest.raises(ConfigError) as error:
        Rule(rule, ["mamba", "noconv"], "claim t")
    message = str(error.value)
    assert message.startswith("claim t: ") and needle in message and "\n" not in message


@pytest.mark.parametrize("rule, expected", [
    ("mamba <= 0.01 and noconv >= 5 * mamba", True),
    ("0 < mamba < noconv < 1", True),
    ("0 < mamba < 0.0001", False),
    ("not (mamba > noconv) or noconv < 0", True),
    ("abs(mamba - noconv) <= 0.06 and min(mamba, noconv, 1) == mamba", True),
    ("max(mamba, noconv) / -mamba < -50", True),
    ("mamba != mamba", False),
])
def test_the_evaluator_computes_what_it_allows(rule, expected):
    assert Rule(rule, ["mamba", "noconv"], "t").evaluate({"mamba": 0.001, "noconv": 0.06}) \
        is expected


@pytest.mark.parametrize("rule, expected", [
    ("a < b", True), ("b < a", False), ("a < c", None), ("c <= a or a < b", True),
    ("a < c and b < a", False), ("not (a < c)", None), ("5 * a < b", False),
    ("abs(a - c) <= 0.5", True),
])
def test_comparisons_decide_only_when_the_intervals_are_apart(rule, expected):
    """Three-valued: True or False when the intervals are apart, None (undecided) when they
    overlap; arithmetic is interval arithmetic; and/or/not are Kleene's."""
    values = {"a": Interval(0.1, 0.2), "b": Interval(0.3, 0.4), "c": Interval(-0.1, 0.15)}
    assert Rule(rule, values, "t").evaluate(values) is expected


# ------------------------------------------------------------------------ the command

def test_claims_md_is_written_with_rows_rules_and_evidence(tmp_path, capsys):
    out = tmp_path / "r"
    put(out, record(MAMBA, gap=0.001), record(NOCONV, gap=0.002))
    rules = rules_file(tmp_path, extra="    contradicts_paper: Without convolution it learns.\n")
    target = tmp_path / "claims.md"
    assert main(["claims", f"out_dir={out}", f"out={target}", f"rules={rules}"]) == 0
    text = target.read_text()
    assert ("**1 paper claim** (0 holds, 0 holds at reduced scale, 1 fails, 0 fails at reduced "
            "scale, 0 task cannot separate, 0 not reached at reduced scale, 0 undecided, 0 not "
            "measured).") in text
    assert "## 000 — A test paper" in text
    row = next(line for line in text.splitlines() if line.startswith("| t-conv"))
    cells = [c.strip() for c in row.strip("|").split(" | ")]
    assert cells[5] == "**fails**" and cells[6].split("<br>") == [
        "control ✓: `mamba <= 0.05`", "rule: `mamba <= 0.01 and noconv >= 5 * mamba`",
        # each comparison: its difference and interval (one seed, no per-sequence values)
        "✓ `mamba <= 0.05`: difference -0.04900 [-0.04920, -0.04880] (unpaired)",
        "✓ `mamba <= 0.01`: difference -0.009000 [-0.009200, -0.008800] (unpaired)",
        "✗ `noconv >= 5 * mamba`: difference -0.003000 [-0.004400, -0.001600] (unpaired)"]
    assert "`mamba` = 0.001000 [0.000800, 0.001200] (seed 0)" in cells[4]
    assert cells[7] == "`python -m bench suite name=leaderboard`"
    assert "- **t-conv** (Fig. 3a): Without convolution it learns. Measured (fails" in text
    assert "1 paper claim (0 holds, 0 holds at reduced scale, 1 fails" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["claims.md", "r", "rules.yaml"]


def bad_rules(tmp_path: Path, name: str) -> str:
    """A rules file with one problem, by name."""
    good = rules_file(tmp_path).read_text()
    bad = tmp_path / f"{name}.yaml"
    bad.write_text({
        "yaml": good.replace("    measure:", "    measure: [unclosed"),
        "path": good.replace("{where: [model=mamba]}", "{where: [model=mamba], metric: gaps.x}"),
        "key": good.replace("model=mamba]", "model.nope=1]"),
        "rule": good.replace("mamba <= 0.01", "__import__('os') or mamba <= 0.01"),
        "scale": good.replace("scale: paper", "scale: huge"),
        "command": good.replace("name=leaderboard", "name=nope"),
        "seed": good.replace("[model=mamba]", "[model=mamba, seed=1]"),
        "field": good.replace("    scale:", "    colour: red\n    scale:"),
        "paper": good.replace('paper: "000"', 'paper: "007"'),
        "duplicate": good + good.split("claims:\n")[1],
        "long": good.replace("mamba <= 0.01", " and ".join(["mamba <= 0.01"] * 20000)),
        "exact": good.replace("{where: [model=mamba]}", "{where: [model=mamba], exact: yes please}"),
        "latin1": good,
    }[name])
    if name == "latin1":
        bad.write_bytes(good.replace("claim:", "# caf\xe9\n    claim:", 1).encode("latin-1"))
    return str(bad)


@pytest.mark.parametrize("name, needle", [
    ("yaml", "not valid YAML"), ("path", "unknown metric path 'gaps.x'"),
    ("key", "unknown key 'model.nope'"), ("rule", "calls other than abs, min, max"),
    ("scale", "scale must be one of paper, cpu"), ("command", "names no existing suite"),
    ("seed", "task, model and trainer keys only"), ("field", "unknown key 'colour'"),
    ("paper", "paper must be one of 000, 002, 004"), ("duplicate", "claim id 't-conv' also in"),
    ("long", "rule of 360019 characters; at most 2000"), ("latin1", "latin1.yaml: not UTF-8 text"),
    ("exact", "exact must be true or false"),
])
def test_a_bad_rules_file_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, name,
                                                                 needle):
    out = tmp_path / "r"
    put(out, record(MAMBA, gap=0.001), record(NOCONV, gap=0.06))
    target = tmp_path / "claims.md"
    target.write_text("the previous claims.md")
    code = main(["claims", f"out_dir={out}", f"out={target}", f"rules={bad_rules(tmp_path, name)}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err
    assert target.read_text() == "the previous claims.md"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".claims")]


def test_a_rules_folder_holds_one_folder_per_paper(tmp_path):
    """The layout of conf/papers: <paper>/claims.yaml, named by that path in errors and in
    claims.md's header; the paper a file declares must be its folder's."""
    folder = tmp_path / "papers"
    (folder / "000").mkdir(parents=True)
    rules_file(tmp_path).rename(folder / "000" / "claims.yaml")
    [claim] = load_claims(folder)
    assert claim.source == "000/claims.yaml"
    (folder / "002").mkdir()
    (folder / "002" / "claims.yaml").write_text((folder / "000" / "claims.yaml").read_text())
    with pytest.raises(ConfigError, match="paper '000' in the folder of paper '002'"):
        load_claims(folder)
    (folder / "002" / "claims.yaml").unlink()
    (folder / "002" / "suites").mkdir()  # a paper's suites are not rules
    (folder / "002" / "suites" / "s.yaml").write_text("runs: [[seed=0]]\n")
    assert [c.source for c in load_claims(folder)] == ["000/claims.yaml"]
    (folder / "000" / "claims.yaml").unlink()
    with pytest.raises(ConfigError, match="holds no \\*.yaml or <paper>/claims.yaml file"):
        load_claims(folder)


def test_rewriting_claims_md_names_every_verdict_that_changed(tmp_path, capsys):
    """A rerun or new records can move a verdict: claims says which moved, against the report it
    rewrites or the one `against=` names, and reads the verdicts back from the rows it wrote (a
    fail is in bold; a | in a claim's text is escaped and does not shift the cells). The research
    check fails on a published report whose verdicts the records do not give."""
    rules = rules_file(tmp_path)
    rules.write_text(rules.read_text().replace("Convolution is the key.", "Conv | no conv."))
    put(tmp_path / "fails", record(MAMBA, gap=0.001), record(NOCONV, gap=0.002))
    put(tmp_path / "holds", record(MAMBA, gap=0.001), record(NOCONV, gap=0.06))
    target = tmp_path / "claims.md"
    assert main(["claims", f"out_dir={tmp_path / 'fails'}", f"out={target}",
                 f"rules={rules}"]) == 0
    assert "verdicts against" not in capsys.readouterr().out  # nothing was there before
    assert claims_mod.verdicts_in(target.read_text()) == {"t-conv": "fails"}
    assert main(["claims", f"out_dir={tmp_path / 'fails'}", f"out={target}",
                 f"rules={rules}"]) == 0
    assert f"verdicts against {target}: none of 1 claim changed" in capsys.readouterr().out
    first = target.read_text()
    assert main(["claims", f"out_dir={tmp_path / 'holds'}", f"out={target}",
                 f"rules={rules}"]) == 0
    out = capsys.readouterr().out
    assert f"verdicts against {target}: 1 of 1 claim changed\n  t-conv: fails → holds\n" in out
    earlier = tmp_path / "earlier.md"
    earlier.write_text(first.replace("| t-conv |", "| t-gone |"))
    assert main(["claims", f"out_dir={tmp_path / 'holds'}", f"out={tmp_path / 'other.md'}",
                 f"rules={rules}", f"against={earlier}"]) == 0
    assert capsys.readouterr().out.splitlines()[-3:] == [
        f"verdicts against {earlier}: 2 of 2 claims changed", "  t-conv: new, holds",
        "  t-gone: gone, was fails"]
    # the research check of a published report: a verdict the records do not give is a problem
    assert main(["claims", f"out_dir={tmp_path / 'holds'}", f"rules={rules}",
                 f"against={earlier}", "check=true"]) == 1
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"error: {earlier} is not what the records give: {line} (`python -m bench claims` "
        "rewrites it)" for line in ("t-conv: new, holds", "t-gone: gone, was fails")]
    assert "2 problems" in captured.out
    assert main(["claims", f"out_dir={tmp_path / 'holds'}", f"rules={rules}",
                 f"against={target}", "check=true"]) == 0


@pytest.mark.parametrize("content, why", [
    (None, "is not a readable file"), ("# Claims\n\nno table\n", "holds no claim rows")])
def test_against_a_report_without_verdicts_is_refused_before_any_record_is_read(
        tmp_path, capsys, content, why):
    put(tmp_path / "r", record(MAMBA), record(NOCONV))
    against = tmp_path / "old.md"
    if content is not None:
        against.write_text(content)
    assert main(["claims", f"out_dir={tmp_path / 'r'}", f"out={tmp_path / 'c.md'}",
                 f"rules={rules_file(tmp_path)}", f"against={against}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"against '{against}' {why}" in err
    assert not (tmp_path / "c.md").exists()


def test_records_that_lack_a_metric_leave_the_claim_not_measured(tmp_path, capsys):
    """Records made before a metric existed (or a rule naming one no record has) leave the row
    `not measured`, naming the metric and what the records hold, and the research check fails
    on it; claims.md is still written for the other rows."""
    out = tmp_path / "r"
    put(out, record(MAMBA, gap=0.001), record(NOCONV, gap=0.06))
    good = rules_file(tmp_path)
    good.write_text(good.read_text().replace("{where: [model=mamba]}",
                                             "{where: [model=mamba], metric: metrics.gap.gd7}"))
    target = tmp_path / "claims.md"
    assert main(["claims", f"out_dir={out}", f"out={target}", f"rules={good}"]) == 0
    capsys.readouterr()
    row = next(line for line in target.read_text().splitlines() if line.startswith("| t-conv"))
    assert "| not measured |" in row
    assert "records lack the metric (mamba: 'metrics.gap.gd7'" in row
    assert "metrics.gap has: bayes, model, unigram" in row
    assert main(["claims", f"out_dir={out}", f"rules={good}", "check=true"]) == 1
    assert "t-conv: not measured" in capsys.readouterr().err


@pytest.mark.parametrize("args, needle", [
    (["bogus=1"], "unknown argument 'bogus=1'"),
    (["out_dir={tmp}/missing"], "does not exist"),
    (["out_dir={tmp}/empty"], "no usable run record"),
    (["include=maybe"], "include must be one of suite|all"),
    (["out={tmp}"], "is a directory"),
    (["out={tmp}/nowhere/claims.md"], "does not exist"),
    (["rules={tmp}/none.yaml"], "does not exist"),
    (["out=a", "out=b"], "given twice"),
])
def test_bad_arguments_are_one_line_exit_2(tmp_path, capsys, args, needle):
    (tmp_path / "empty").mkdir()
    put(tmp_path / "r", record(MAMBA), record(NOCONV))
    argv = ["claims", *(a.format(tmp=tmp_path) for a in args)]
    if not any(a.startswith("out_dir=") for a in argv):
        argv.append(f"out_dir={tmp_path / 'r'}")
    if not any(a.startswith("rules=") for a in argv):
        argv.append(f"rules={rules_file(tmp_path)}")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and needle in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_claims_md_is_replaced_atomically(tmp_path, monkeypatch):
    """The old file stays whole when writing fails half-way, and no temporary file is left."""
    out = tmp_path / "r"
    put(out, record(MAMBA, gap=0.001), record(NOCONV, gap=0.06))
    target = tmp_path / "claims.md"
    target.write_text("old")
    rules = rules_file(tmp_path)

    def half_then_fail(self, text):
        Path.write_bytes(self, text[:10].encode())
        raise OSError("disk full")

    monkeypatch.setattr(Path, "write_text", half_then_fail)
    with pytest.raises(ConfigError, match="not written: disk full"):  # one line, exit 2
        write_claims(select_runs(str(out)), str(target), rules)
    monkeypatch.undo()
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["claims.md", "r", "rules.yaml"]
    write_claims(select_runs(str(out)), str(target), rules)
    assert target.read_text().startswith("# Claims")


def test_from_the_shell_help_and_a_one_line_error(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "bench", "claims", "--help"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("python -m bench claims")
    done = subprocess.run([sys.executable, "-m", "bench", "claims", "out_dir=missing"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ")
    assert "Traceback" not in done.stderr and list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------ the shipped claims

@pytest.fixture(scope="module")
def shipped():
    return load_claims()


def test_the_shipped_claims_parse_and_cover_the_three_papers(shipped):
    assert len(shipped) >= 25
    assert {c.paper for c in shipped} == {"000", "002", "004"}
    assert sorted(claims_mod.paper_titles(default_rules())) == ["000", "002", "004"]
    assert len({c.id for c in shipped}) == len(shipped)
    for claim in shipped:
        assert set(claim.rule.used) <= set(claim.quantities), claim.id  # its own quantities
        assert claim.rule.used, claim.id
        assert claim.text and claim.paper_number and claim.section, claim.id


def test_every_shipped_command_is_a_valid_bench_command(shipped):
    """Each names an existing suite whose every entry composes, or a run that composes."""
    suites = set()
    for claim in shipped:
        for command in claim.commands:
            words = shlex.split(command)
            assert words[:3] == ["python", "-m", "bench"], command
            if words[3] == "suite":
                [name] = [w.split("=", 1)[1] for w in words[4:] if w.startswith("name=")]
                assert name in choices("suite"), command
                suites.add(name)
            else:
                assert words[3] in ("run", "references"), command
                compose([w for w in words[4:] if not w.startswith("n=")])
    for name in suites:
        for entry in load_suite(name):
            compose(entry)


def test_the_research_check_finds_a_cpu_claim_left_unmeasured(tmp_path, capsys):
    """`claims check=true` is the named check of the committed records (.ci/run runs it); here
    on synthetic records it must find what is wrong."""
    out = tmp_path / "r"
    put(out, record(MAMBA, gap=0.001))  # noconv has no record
    assert main(["claims", f"out_dir={out}", f"rules={rules_file(tmp_path)}",
                 "check=true"]) == 1
    err = capsys.readouterr().err
    assert "t-conv: not measured on records a CPU can make (noconv)" in err
    put(out, record(NOCONV, gap=0.06))
    assert main(["claims", f"out_dir={out}", f"rules={rules_file(tmp_path)}",
                 "check=true"]) == 0


def test_the_research_check_finds_stale_evidence_against_a_paper(tmp_path, capsys):
    """A claim the records now say holds must not keep its `contradicts_paper` text; a claim
    that fails may."""
    out = tmp_path / "r"
    extra = "    contradicts_paper: \"our records say otherwise\"\n"
    rules = rules_file(tmp_path, extra=extra)
    put(out, record(MAMBA, gap=0.001), record(NOCONV, gap=0.06))  # holds
    assert main(["claims", f"out_dir={out}", f"rules={rules}", "check=true"]) == 1
    assert "t-conv: holds, yet its rules name evidence against the paper" in \
        capsys.readouterr().err
    put(tmp_path / "f", record(MAMBA, gap=0.001), record(NOCONV, gap=0.002))  # fails
    assert main(["claims", f"out_dir={tmp_path / 'f'}", f"rules={rules}", "check=true"]) == 0


def test_the_paper_suites_produce_the_records_their_claims_select(shipped):
    """Every quantity of a claim whose command is a paper suite is made by an entry of one of
    its suites (or already by the leaderboard's): running the suites decides the claims."""
    unmatched = []
    for claim in shipped:
        if claim.needs:
            continue
        for name, quantity in claim.quantities.items():
            if not any(claims_mod.producing(c, quantity) for c in claim.commands):
                unmatched.append(f"{claim.id}.{name}")
        # a claim that names a GPU suite gets its paper-scale records from it
        if any("_gpu" in command for command in claim.commands):
            for name, quantity in (claim.paper_quantities or {}).items():
                if not any(claims_mod.producing(c, quantity) for c in claim.commands):
                    unmatched.append(f"{claim.id}.{name} (paper scale)")
    assert unmatched == []


def test_a_quantity_reads_the_records_that_carry_its_metric(tmp_path):
    """A row pooled by identity can hold an older record without a metric added since: the
    quantity reads the seeds whose records have it, and says what is missing when none has."""
    out = tmp_path / "r"
    old = record(MAMBA, seed=0, gap=0.001, stamp="20260101-100000")
    del old["metrics"]["task"]["excess"]
    put(out, old, record(MAMBA, seed=1, gap=0.002), record(NOCONV, gap=0.06))
    rows = [runs for s in select_runs(str(out)).sections for runs in s.rows.values()]
    from bench.reports.claims.verdicts import pick
    (claim,) = load_claims(rules_file(tmp_path))
    quantity = claim.quantities["mamba"]
    assert len(pick(quantity, rows)) == 2  # the gap: both seeds
    excess = dataclasses.replace(quantity, metric="metrics.task.excess.model[0]",
                                 path=["metrics", "task", "excess", "model"], index="0")
    assert [r["seed"] for r in pick(excess, rows)] == [1]


def test_claims_decided_on_the_same_records_say_so(tmp_path):
    """Two claims whose quantities read exactly the same records are one measurement read
    twice: each row names the other; a claim on other records names none."""
    rules = tmp_path / "rules.yaml"
    text = RULES.format(rule="mamba <= 0.01 and noconv >= 5 * mamba", scale="paper", extra="",
                        control="mamba <= 0.05")
    twin = text.split("claims:\n", 1)[1].replace("id: t-conv", "id: t-twin")
    alone = (twin.replace("id: t-twin", "id: t-alone")
             .replace("noconv: {where: [model=mamba, model.conv=false]}",
                      "noconv: {where: [model=mamba, model.conv=false, model.d_model=32]}"))
    # the rule of t-control reads t-conv's records; its control reads one more
    control = (twin.replace("id: t-twin", "id: t-control")
               .replace("      noconv: {where: [model=mamba, model.conv=false]}",
                        "      noconv: {where: [model=mamba, model.conv=false]}\n"
                        "      wide: {where: [model=mamba, model.conv=false, model.d_model=32]}")
               .replace('control: "mamba <= 0.05"', 'control: "mamba <= 0.05 and wide > 0"'))
    rules.write_text(text + twin + alone + control)
    out = tmp_path / "r"
    put(out, record(MAMBA, gap=0.001), record(NOCONV, gap=0.06),
        record([*NOCONV, "model.d_model=32"], gap=0.06))
    claims_md = tmp_path / "claims.md"
    from bench.reports.claims import write_claims
    write_claims(select_runs(str(out)), str(claims_md), rules)
    rows = {line.split("|")[1].strip(): line for line in claims_md.read_text().splitlines()
            if line.startswith("| t-")}
    assert "the same records as t-twin; its rule reads the same records as t-control" \
        in rows["t-conv"]
    assert "the same records as t-conv; its rule reads the same records as t-control" \
        in rows["t-twin"]
    assert "; its rule reads the same records as t-conv, t-twin" in rows["t-control"]
    assert "the same records" not in rows["t-alone"]


def test_a_row_says_when_records_of_one_seed_disagree_and_rounding_is_no_disagreement(
        tmp_path, capsys):
    """Two records of one seed and version that disagree (training amplifies float-level
    differences) are pooled as one experiment: the row says so and which is used. Two that
    differ by rounding of the losses (a gap is a difference of two losses of ~0.5: 1e-8 of it
    is 2e-8 of the loss, below the identity's tolerance) are no disagreement."""
    out = tmp_path / "r"
    put(out, record(MAMBA, seed=0, gap=0.0010, stamp="20260101-100000"),
        record(MAMBA, seed=0, gap=0.0015, stamp="20260102-100000"),
        record(MAMBA, seed=1, gap=0.00002, stamp="20260101-100000"),
        record(MAMBA, seed=1, gap=0.00002 + 1e-8, stamp="20260102-100000"),
        record(NOCONV, seed=0, gap=0.06), record(NOCONV, seed=1, gap=0.07))
    selection = select_runs(str(out))
    assert [(older["seed"], newer["metrics"]["bayes_gap"]) for section in selection.sections
            for _, older, newer in section.conflicts] == [(0, 0.0015)]
    [d] = decide_all(load_claims(rules_file(tmp_path)), selection)
    assert d.values["mamba"].twins == {0: (0.0015, [0.0010])}
    assert ("records of one version disagree on seed 0 (up to 33% of the value used, `mamba` "
            "of seed 0: float-level differences between code versions or thread counts that "
            "training amplifies); the newest of each seed is used") in claims_mod.ours_cell(d)


def test_a_rows_disagreement_is_the_largest_of_all_its_measures(tmp_path):
    """Measures share seeds: one measure's twins of seed 0 must not hide another's. The row
    reports the largest disagreement (mamba's 50%, not noconv's 1%), with its measure."""
    out = tmp_path / "r"
    put(out, record(MAMBA, seed=0, gap=0.0010, stamp="20260101-100000"),
        record(MAMBA, seed=0, gap=0.0020, stamp="20260102-100000"),
        record(MAMBA, seed=1, gap=0.0011),
        record(NOCONV, seed=0, gap=0.0606, stamp="20260101-100000"),
        record(NOCONV, seed=0, gap=0.0600, stamp="20260102-100000"),
        record(NOCONV, seed=1, gap=0.07))
    [d] = decide_all(load_claims(rules_file(tmp_path)), select_runs(str(out)))
    assert d.values["mamba"].twins == {0: (0.0020, [0.0010])}
    assert d.values["noconv"].twins == {0: (0.0600, [0.0606])}
    assert "disagree on seed 0 (up to 50% of the value used, `mamba` of seed 0:" \
        in claims_mod.ours_cell(d)
    d.values["mamba"].twins = {}  # then noconv's 1%; and below 1%, not "up to 0%"
    assert "disagree on seed 0 (up to 1% of the value used, `noconv` of seed 0:" \
        in claims_mod.ours_cell(d)
    d.values["noconv"].twins = {0: (0.0600, [0.06003])}
    assert "(up to 0.05% of the value used, `noconv` of seed 0:" in claims_mod.ours_cell(d)


def test_a_verdict_that_rests_on_which_draw_of_a_seed_is_used_is_undecided(tmp_path, capsys):
    """A seed drawn twice whose records disagree: the claim is decided on the newest draws and on
    the oldest. Where both give one verdict it stands; where they differ (noconv of seed 1 learned
    in its older draw, which leaves the rule's interval across seeds over 0) it is undecided, the
    row says why, and the plan says that seeds, not its power estimate, would decide it."""
    def claim_on(noconv_seed1_draws):
        out = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
        put(out, *(record(MAMBA, seed=s, gap=0.001 + s * 1e-4) for s in (0, 1, 2)),
            record(NOCONV, seed=0, gap=0.06), record(NOCONV, seed=2, gap=0.065),
            *(record(NOCONV, seed=1, gap=g, stamp=f"2026010{i + 1}-100000")
              for i, g in enumerate(noconv_seed1_draws)))
        [d] = decide_all(load_claims(rules_file(tmp_path)), select_runs(str(out)))
        return out, d
    _, d = claim_on([0.05, 0.07])  # both draws: noconv ≥ 5 × mamba
    assert d.verdict == "holds" and d.on_draws is None
    assert "the newest of each seed is used" in claims_mod.ours_cell(d)
    out, d = claim_on([0.002, 0.07])  # the older draw learned without convolution
    assert (d.verdict, d.on_draws) == ("undecided", ("holds", "undecided"))
    assert d.values["noconv"].twins == {1: (0.07, [0.002])}
    assert ("records of one version disagree on seed 1 (up to 97% of the value used, `noconv` of "
            "seed 1: float-level differences between code versions or thread counts that training "
            "amplifies); on the newest of each seed the verdict is holds, on the oldest undecided: "
            "it rests on the draw, so it is undecided") in claims_mod.ours_cell(d)
    assert main(["claims", "plan", f"out_dir={out}", f"rules={rules_file(tmp_path)}"]) == 0
    assert ("the verdict rests on which of a seed's disagreeing records is used (holds on the "
            "newest, undecided on the oldest): more seeds") in capsys.readouterr().out


def test_older_draws_without_the_interval_a_claim_needs_leave_the_newest_to_decide(tmp_path):
    """A seed drawn twice, the older record made before records carried the interval the rule
    needs: on the oldest draws the claim is undecided for want of it, which is no verdict to set
    against the newest's (the rule reads the probe's value a_switch on one seed)."""
    rules = tmp_path / "switch.yaml"
    rules.write_text(rules_file(tmp_path).read_text().split("claims:")[0] + "claims:\n" + """\
  - id: t-probe
    section: s
    claim: c
    paper_number: p
    where: [task=markov, model=mamba, trainer.max_steps=1000, trainer.lr=0.01]
    measure:
      a: {metric: metrics.probe.a, range: [0, 1]}
    kind: attainment
    rule: "a <= 0.1"
    scale: paper
    command: python -m bench suite name=leaderboard
""")
    older = record(MAMBA, seed=0, gap=0.001, stamp="20260101-100000")
    older["metrics"]["probe"] = {"a": 0.02}  # no interval: made before they were written
    newer = record(MAMBA, seed=0, gap=0.0012, stamp="20260102-100000")  # another draw
    newer["metrics"]["probe"] = {"a": 0.03, "a_ci": [0.025, 0.035]}
    put(tmp_path / "r", older, newer)
    [d] = decide_all(load_claims(rules), select_runs(str(tmp_path / "r")))
    assert d.values["a"].twins and d.verdict == "holds" and d.on_draws is None
    assert "the oldest draws decide nothing (their records give no interval)" in d.note


def test_a_reference_without_an_interval_adds_no_held_out_noise_and_the_row_says_so(tmp_path):
    """A reference whose records give it no interval (zero width) cannot add its held-out noise
    to a paired comparison: the pairing says it was not counted, not that it was."""
    out = tmp_path / "r"
    records = [record(MAMBA, seed=s, gap=g) for s, g in enumerate([0.001, 0.0012, 0.0011])]
    for rec in records:
        rec["metrics"]["gap_ci"]["unigram"] = [0.08, 0.08]
    put(out, *records)
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(rule="mamba <= 0.1 * unigram", scale="paper", extra="",
                                  control="mamba <= 0.05").replace(
        "      noconv: {{where: [model=mamba, model.conv=false]}}\n".replace("{{", "{")
        .replace("}}", "}"),
        "      unigram: {where: [model=mamba], metric: metrics.gap.unigram}\n"))
    [d] = decide(out, rules)
    assert d.tests[-1].paired == ("3 seeds; the held-out noise of mamba from its own interval; "
                                  "the held-out noise of unigram not counted (its records give "
                                  "it no interval)")


@pytest.mark.parametrize("kind, gaps, judged, flagged", [
    # an attainment not reached on the mean, while seed 0 reached it on its own interval
    ("attainment", {"mamba": [0.005, 0.03, 0.03, 0.03, 0.03]}, "mamba", "seed 0 reach it"),
    # a claim that noconv stays above 0.05 holds on the mean, while seed 4's model got there
    ("trained", {"noconv": [0.3, 0.3, 0.3, 0.3, 0.01]}, "noconv", "seed 4 left the level")])
def test_claims_check_finds_a_mean_that_outvotes_a_run_that_would_turn_the_verdict(
        tmp_path, kind, gaps, judged, flagged):
    """One run shows that a model reaches a level, and refutes a claim that it does not: a
    verdict on the mean over seeds that such a run would turn is a problem until the claim is
    judged on the run that trained best."""
    from bench.reports.claims.check import problems
    out = tmp_path / "r"
    mamba = gaps.get("mamba", [0.001] * 5)
    noconv = gaps.get("noconv", [0.3] * 5)
    put(out, *(record(MAMBA, seed=s, gap=g) for s, g in enumerate(mamba)),
        *(record(NOCONV, seed=s, gap=g) for s, g in enumerate(noconv)))
    rule = "mamba <= 0.01" if kind == "attainment" else "noconv >= 0.05"
    extra = "    kind: attainment\n" if kind == "attainment" else ""
    [d] = decide(out, rules_file(tmp_path, rule=rule, scale="cpu", extra=extra))
    assert d.verdict == ("not reached at reduced scale" if kind == "attainment"
                         else "holds at reduced scale")
    [problem] = problems([d])
    assert flagged in problem and "judge_seed" in problem
    for i, path in enumerate(sorted(out.glob("*.json"))):  # training curves to choose a seed by
        rec = json.loads(path.read_text())
        rec["train"]["loss_curve"] = [[0, 1.0], [10, 0.5 + 0.01 * i]]
        path.write_text(json.dumps(rec))
    [d] = decide(out, rules_file(tmp_path, rule=rule, scale="cpu",
                                 extra=extra + f"    judge_seed: {judged}\n"))
    assert problems([d]) == []
