"""A record that cannot be right is refused wherever records are read (bench.records.schema through
bench.records.store.read_record): leaderboard, claims, compare, plot and the suite runner all leave it
out with one line naming the file and the field — never pooled, never the winner of a tie.

The first tests are the outside audit's cases (a `bayes_gap` of 1e308 outside its own interval
won the newest-wins tie and claims.md printed it; a reversed interval was printed reversed; a
`provenance` list made a row of code "unknown"); then a planted record of every malformed kind
through each reader."""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from bench.cli.main import main
from bench.records.store import read_records
from test_claims import MAMBA, NOCONV, put, record, rules_file


def good(seed: int = 0, gap: float = 0.001, stamp: str = "20260101-120000", **extra) -> dict:
    """A well-formed `ok` record with per-sequence losses and a loss curve."""
    rec = record(MAMBA, seed=seed, gap=gap, stamp=stamp, **extra)
    n = rec["metrics"]["sequences"]
    rec["metrics"]["held_out_digest"] = "d" * 64
    rec["per_sequence"] = {"bands": [], "loss": {name: [value] * n for name, value
                                                 in rec["metrics"]["loss"].items()}}
    rec["per_sequence"].update(band_loss={"model": []})
    rec["metrics"]["gap_by_band"] = []
    rec["train"]["loss_curve"] = [[0, 0.7], [10, 0.6]]
    return rec


def claims_md(results: Path, tmp_path: Path) -> tuple[int, str]:
    out = tmp_path / "claims.md"
    code = main(["claims", f"out_dir={results}", f"out={out}", f"rules={rules_file(tmp_path)}"])
    return code, out.read_text() if out.exists() else ""


# --------------------------------------------------------------- the audit's cases

def test_a_gap_outside_its_own_interval_is_refused_not_the_winner_of_a_tie(tmp_path, capsys):
    results = tmp_path / "results"
    real = good(seed=0, gap=0.00115, stamp="20260101-120000")
    forged = good(seed=0, gap=0.00115, stamp="20260102-120000")  # newer: it won the tie
    forged["metrics"]["bayes_gap"] = 1e308
    _, bad = put_both(results, real, forged)
    put(results, record(NOCONV, gap=0.06))
    code, text = claims_md(results, tmp_path)
    err = capsys.readouterr().err
    assert code == 0
    assert f"warning: skipped {bad}: metrics.bayes_gap_ci" in err and "far from its value" in err
    assert "1e+308" not in text and "`mamba` = 0.001150" in text
    board = tmp_path / "lb.md"
    assert main(["leaderboard", f"out_dir={results}", f"out={board}"]) == 0
    assert "1e+308" not in board.read_text() and "0.00115" in board.read_text()


def put_both(results: Path, *recs: dict) -> list[Path]:
    put(results, *recs)
    return [results / f"{r['run_id']}.json" for r in recs]


def test_a_reversed_interval_is_refused_not_printed_reversed(tmp_path, capsys):
    results = tmp_path / "results"
    rec = good(gap=0.001)
    rec["metrics"]["bayes_gap_ci"] = [0.0012, 0.0008]
    [path] = put_both(results, rec)
    assert main(["leaderboard", f"out_dir={results}", f"out={tmp_path / 'lb.md'}"]) == 2
    err = capsys.readouterr().err
    assert f"warning: skipped {path}: metrics.bayes_gap_ci is reversed (0.0012 > 0.0008)" in err


def test_a_provenance_that_is_not_a_mapping_does_not_push_the_real_row_out(tmp_path, capsys):
    results = tmp_path / "results"
    real = [good(seed=s, gap=0.001 + 0.0001 * s) for s in (0, 1, 2)]
    odd = good(seed=3, gap=0.002, stamp="20260105-120000")
    odd["provenance"] = ["a" * 40]
    paths = put_both(results, *real, odd)
    board = tmp_path / "lb.md"
    assert main(["leaderboard", f"out_dir={results}", f"out={board}"]) == 0
    err = capsys.readouterr().err
    assert f"warning: skipped {paths[-1]}: provenance is a list, not a mapping" in err
    text = board.read_text()
    assert "unknown" not in text and "older code versions" not in text
    assert "| 3 |" in text  # the real row, three seeds


def test_two_records_of_one_seed_that_differ_are_reported_with_both_files(tmp_path, capsys):
    """Same commit, same seed, different numbers: the newer is used and the CLI says so."""
    results = tmp_path / "results"
    older, newer = put_both(results, good(seed=0, gap=0.001, stamp="20260101-120000"),
                            good(seed=0, gap=0.0013, stamp="20260102-120000"))
    assert main(["leaderboard", f"out_dir={results}", f"out={tmp_path / 'lb.md'}"]) == 0
    err = capsys.readouterr().err
    assert (f"warning: {older} and {newer}: two records of mamba seed 0 in one row differ "
            f"(0.001 vs 0.0013); the newer is used") in err
    assert "records of one seed in one row differ" in (tmp_path / "lb.md").read_text()


def test_identical_duplicates_are_counted_not_warned_about(tmp_path, capsys):
    results = tmp_path / "results"
    put_both(results, good(seed=0, stamp="20260101-120000"), good(seed=0, stamp="20260102-120000"))
    assert main(["leaderboard", f"out_dir={results}", f"out={tmp_path / 'lb.md'}"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_consistent_record_passes_the_check():
    """The planted record itself is well-formed: every case below changes one thing."""
    from bench.records.schema import problem
    assert problem(json.loads(json.dumps(good()))) is None


# --------------------------------------------------------------- every malformed kind

def drop(*keys):
    def change(rec):
        node = rec
        for key in keys[:-1]:
            node = node[key]
        del node[keys[-1]]
    return change


def put_at(value, *keys):
    def change(rec):
        node = rec
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = copy.deepcopy(value)
    return change


N = 64  # good()'s held-out sequences
# (name, change, a fragment of the reason)
MALFORMED = [
    ("no run_id", drop("run_id"), "run_id"),
    ("run_id a number", put_at(5, "run_id"), "run_id (a int)"),
    ("run_id empty", put_at("", "run_id"), "run_id is empty"),
    ("task a list", put_at(["markov"], "task"), "task.name"),
    ("task.name null", put_at(None, "task", "name"), "task.name"),
    ("task.config a string", put_at("order=1", "task", "config"), "task.config (a str)"),
    ("model.name a number", put_at(3, "model", "name"), "model.name (a int)"),
    ("model.config a list", put_at([], "model", "config"), "model.config (a list)"),
    ("trainer.config null", put_at(None, "trainer", "config"), "trainer.config"),
    ("no trainer", drop("trainer"), "trainer.config"),
    ("seed a string", put_at("0", "seed"), "seed (a str)"),
    ("seed true", put_at(True, "seed"), "seed (a bool)"),
    ("seed negative", put_at(-1, "seed"), "seed (negative)"),
    ("seed a float", put_at(1.5, "seed"), "seed (a float)"),
    ("status unknown", put_at("done", "status"), "status 'done' is not one of"),
    ("status null", put_at(None, "status"), "status"),
    ("name a number", put_at(5, "name"), "name is not a string"),
    ("origin a number", put_at(5, "origin"), "origin is not a string"),
    ("overrides a string", put_at("model=mamba", "overrides"), "overrides is not a list"),
    ("overrides of numbers", put_at([1], "overrides"), "overrides is not a list"),
    ("provenance a list", put_at(["a" * 40], "provenance"), "provenance is a list"),
    ("provenance a string", put_at("abc", "provenance"), "provenance is a str"),
    ("provenance.commit a number", put_at(5, "provenance", "commit"), "provenance.commit"),
    ("provenance.dirty a string", put_at("no", "provenance", "dirty"), "provenance.dirty"),
    ("provenance.code a list", put_at([], "provenance", "code"), "provenance.code"),
    ("params a string", put_at("100", "params"), "params (a str)"),
    ("params negative", put_at(-5, "params"), "params (negative)"),
    ("state_size null", put_at(None, "state_size"), "state_size"),
    ("train.steps a float", put_at(1.5, "train", "steps"), "train.steps (a float)"),
    ("train.steps negative", put_at(-1, "train", "steps"), "train.steps (negative)"),
    ("wall time a string", put_at("1", "train", "wall_time_s"), "train.wall_time_s (a str)"),
    ("wall time negative", put_at(-1.0, "train", "wall_time_s"), "wall_time_s (negative)"),
    ("wall time infinite", put_at(math.inf, "train", "wall_time_s"), "not a finite number"),
    ("no metrics", drop("metrics"), "metrics.sequences"),
    ("sequences zero", put_at(0, "metrics", "sequences"), "metrics.sequences is below 1"),
    ("sequences a string", put_at("64", "metrics", "sequences"), "metrics.sequences (a str)"),
    ("loss a list", put_at([0.5], "metrics", "loss"), "metrics.loss (a list)"),
    ("roles null", put_at(None, "metrics", "roles"), "metrics.roles"),
    ("gap_reference a number", put_at(1, "metrics", "gap_reference"), "metrics.gap_reference"),
    ("bayes_gap 1e308", put_at(1e308, "metrics", "bayes_gap"), "far from its value 1e+308"),
    ("bayes_gap -1e308", put_at(-1e308, "metrics", "bayes_gap"), "far from its value -1e+308"),
    ("bayes_gap far", put_at(0.5, "metrics", "bayes_gap"), "far from its value 0.5"),
    ("bayes_gap NaN", put_at(math.nan, "metrics", "bayes_gap"), "not a finite number"),
    ("bayes_gap a string", put_at("0.001", "metrics", "bayes_gap"), "metrics.bayes_gap (a str)"),
    ("bayes_gap_ci reversed", put_at([0.0012, 0.0008], "metrics", "bayes_gap_ci"), "reversed"),
    ("bayes_gap_ci of one", put_at([0.001], "metrics", "bayes_gap_ci"), "not a pair of numbers"),
    ("bayes_gap_ci of strings", put_at(["a", "b"], "metrics", "bayes_gap_ci"), "bayes_gap_ci"),
    ("bayes_gap_ci infinite", put_at([-math.inf, math.inf], "metrics", "bayes_gap_ci"),
     "bayes_gap_ci"),
    ("bayes_gap_ci a number", put_at(0.001, "metrics", "bayes_gap_ci"), "bayes_gap_ci (a float)"),
    ("gap_ci.model reversed", put_at([0.0012, 0.0008], "metrics", "gap_ci", "model"),
     "metrics.gap_ci.model is reversed"),
    ("gap_ci.model far", put_at([0.9, 0.91], "metrics", "gap_ci", "model"),
     "metrics.gap_ci.model [0.9, 0.91] is far from its value"),
    ("gap.model NaN", put_at(math.nan, "metrics", "gap", "model"), "metrics.gap.model"),
    ("gap.model a string", put_at("x", "metrics", "gap", "model"), "metrics.gap.model"),
    ("loss.model infinite", put_at(math.inf, "metrics", "loss", "model"), "metrics.loss.model"),
    ("loss_ci.model reversed", put_at([0.6, 0.4], "metrics", "loss_ci", "model"),
     "metrics.loss_ci.model is reversed"),
    ("loss_ci.model far", put_at([5.0, 5.1], "metrics", "loss_ci", "model"),
     "metrics.loss_ci.model [5, 5.1] is far"),
    ("loss_ci a list", put_at([[0.4, 0.6]], "metrics", "loss_ci"), "metrics.loss_ci is not a"),
    ("gap_ci a list", put_at([], "metrics", "gap_ci"), "metrics.gap_ci (a list)"),
    ("relative_gap infinite", put_at(math.inf, "metrics", "relative_gap"), "relative_gap"),
    ("gap_ci lacks bayes", drop("metrics", "gap_ci", "bayes"), "lack the loss, gap or interval"),
    ("loss lacks the reference", drop("metrics", "loss", "bayes"), "lack the loss, gap"),
    ("scoring unknown", put_at("bleu", "metrics", "scoring"), "unknown metrics.scoring 'bleu'"),
    ("per-position strings", put_at(["a"], "per_position", "gap.model"), "per_position.gap.model"),
    ("per-position missing", drop("per_position", "gap.model"), "per_position.gap.model"),
    ("per-position other", put_at("x", "per_position", "accuracy.model"),
     "per_position.accuracy.model is not a list"),
    ("per-sequence short", put_at([0.5] * (N - 1), "per_sequence", "loss", "model"),
     f"per_sequence.loss.model is not {N} numbers"),
    ("per-sequence strings", put_at(["x"] * N, "per_sequence", "loss", "model"),
     "per_sequence.loss.model"),
    ("per-sequence NaN", put_at([math.nan] * N, "per_sequence", "loss", "model"),
     "per_sequence.loss.model"),
    ("per_sequence a list", put_at([], "per_sequence"), "per_sequence is not a mapping"),
    ("per_sequence.loss a list", put_at([], "per_sequence", "loss"), "per_sequence is not a"),
    ("per_sequence.task a list", put_at([], "per_sequence", "task"),
     "per_sequence.task is not a mapping"),
    ("per-sequence task values short",
     put_at({"e": {"mean": {"model": [0.1] * (N - 1)}}}, "per_sequence", "task"),
     f"per_sequence.task.e.mean.model is not {N} numbers"),
    ("per-sequence task value a string", put_at({"e": {"coordinates": "2"}}, "per_sequence", "task"),
     "per_sequence.task.e.coordinates is neither numbers nor a mapping"),
    ("held_out_digest a number", put_at(5, "metrics", "held_out_digest"), "held_out_digest"),
    ("loss curve of singles", put_at([[0]], "train", "loss_curve"), "train.loss_curve"),
    ("loss curve string steps", put_at([["0", 1.0]], "train", "loss_curve"), "train.loss_curve"),
    ("loss curve a string", put_at("x", "train", "loss_curve"), "train.loss_curve"),
    ("val curve NaN", put_at([[5, math.nan]], "train", "val_curve"), "train.val_curve"),
]
assert len(MALFORMED) >= 70


def planted(tmp_path: Path, change) -> tuple[Path, Path, Path]:
    """results/ with a good seed-0 record and, as seed 1, the malformed one."""
    results = tmp_path / "results"
    bad = good(seed=1, gap=0.0012, stamp="20260102-120000")
    bad_path = results / f"{bad['run_id']}.json"
    change(bad)
    [good_path] = put_both(results, good(seed=0))
    bad_path.write_text(json.dumps(bad))
    return results, good_path, bad_path


@pytest.mark.parametrize("name, change, reason", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_read_records_refuses_it_naming_the_field(tmp_path, name, change, reason):
    results, good_path, bad_path = planted(tmp_path, change)
    found, bad = read_records(results)
    assert [r["_path"] for r in found] == [str(good_path)]
    assert len(bad) == 1 and bad[0][0] == str(bad_path) and reason in bad[0][1], bad


@pytest.mark.parametrize("name, change, reason", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_the_leaderboard_names_it_and_shows_the_good_seed_alone(tmp_path, capsys, name, change,
                                                                reason):
    results, _, bad_path = planted(tmp_path, change)
    board = tmp_path / "lb.md"
    assert main(["leaderboard", f"out_dir={results}", f"out={board}"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: skipped {bad_path}: ") \
        and reason in err[0], err
    assert "| 1 |" in board.read_text()  # one seed: the good one


@pytest.mark.parametrize("name, change, reason", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_compare_refuses_it_in_one_line_exit_2(tmp_path, capsys, name, change, reason):
    _, good_path, bad_path = planted(tmp_path, change)
    assert main(["compare", str(good_path), str(bad_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: compare: {bad_path}: ") \
        and reason in err, err


@pytest.mark.parametrize("name, change, reason", MALFORMED[::4], ids=[m[0] for m in MALFORMED[::4]])
def test_plot_names_it_and_draws_nothing_from_it(tmp_path, capsys, name, change, reason):
    _, _, bad_path = planted(tmp_path, change)
    assert main(["plot", str(bad_path), f"out={tmp_path / 'p.png'}"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"warning: skipped {bad_path}: ") and reason in err[0], err
    assert "no usable" in err[-1] and not (tmp_path / "p.png").exists()


@pytest.mark.parametrize("name, change, reason", MALFORMED[::3], ids=[m[0] for m in MALFORMED[::3]])
def test_claims_name_it_and_decide_on_the_good_records(tmp_path, capsys, name, change, reason):
    results, _, bad_path = planted(tmp_path, change)
    put(results, record(NOCONV, gap=0.06))
    code, text = claims_md(results, tmp_path)
    err = capsys.readouterr().err.splitlines()
    assert code == 0 and len(err) == 1 and err[0].startswith(f"warning: skipped {bad_path}: ")
    assert "`mamba` = 0.001000" in text and "(seed 0)" in text


@pytest.mark.parametrize("values", [
    [], [1.0, 2.5], [1.0, None], [None], [1, 2.0], [0.0, float("nan")], [None, float("inf")],
    [None, 1.0, -float("inf")], [True], [1.0, "1"], [1.0, [1.0]], [10 ** 400]])
def test_a_list_is_checked_as_its_values_one_by_one(values):
    """numbers_or_nulls' fast path (floats and nulls, checked in C) against its definition."""
    from bench.records.schema import number_or_null, numbers_or_nulls

    def outcome(check):
        try:
            return check()
        except OverflowError:
            return OverflowError
    assert outcome(lambda: numbers_or_nulls(values)) == outcome(
        lambda: all(number_or_null(v) for v in values))
