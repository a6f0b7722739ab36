"""python -m bench compare: the paired difference of two runs on the same held-out sequences,
against direct computations of its definition, and what it refuses."""
import copy
import json
import math

import numpy as np
import pytest

from bench.config import TrainerConfig
from bench.config.formats import fmt_sig
from tasks.stats import across_seeds
import torch

from bench.cli.main import main
from bench.reports.compare import compare
from bench.training.evaluate import score_predictions
from bench.records.store import SCHEMA, json_safe
from tasks.markov import MarkovConfig, MarkovTask
from tasks.stats import bootstrap_ci, paired_difference

RESAMPLES = 400


def mixture(preds: dict, weight: float) -> torch.Tensor:
    """Log-probabilities of weight · Bayes + (1 − weight) · unigram: a model between the two."""
    return torch.log(weight * preds["bayes"].exp() + (1 - weight) * preds["unigram"].exp())


def record_of(task, batch, prediction, model="mamba", seed=0) -> dict:
    """An `ok` run record (as JSON would hold it) of a model that predicted `prediction`."""
    result = score_predictions(task, batch, prediction, RESAMPLES)
    record = {"schema": SCHEMA, "run_id": f"markov--{model}--s{seed}", "status": "ok",
              "task": {"name": "markov", "config": task.config_dict()},
              "model": {"name": model, "config": {}},
              "trainer": {"name": "default", "config": {"bootstrap": RESAMPLES}},
              "seed": seed, "overrides": [], "params": 1, "state_size": 1,
              "train": {"steps": 10, "wall_time_s": 1.0}, **result}
    return json.loads(json.dumps(json_safe(record)))


@pytest.fixture(scope="module")
def runs():
    """Records of two models on one held-out set (seq_len 80: all three bands), and the task."""
    task = MarkovTask(MarkovConfig(order=1, vocab_size=3, seq_len=80))
    batch = task.held_out(300)
    preds = {name: ref.predict(batch) for name, ref in task.references().items()}
    return (task, batch, preds, record_of(task, batch, mixture(preds, 0.9)),
            record_of(task, batch, mixture(preds, 0.6), model="transformer"))


def write(tmp_path, name: str, record: dict) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(record))
    return str(path)


def test_the_paired_interval_is_the_percentile_bootstrap_of_the_differences():
    rng = np.random.default_rng(1)
    a = rng.normal(1.0, 0.3, 257)
    b = a + rng.normal(0.01, 0.02, 257)
    paired = paired_difference(a.tolist(), b.tolist(), RESAMPLES)
    # the definition: resample sequences (evaluate.bootstrap_ci's index draw, seed 0), mean of
    # b − a in each resample, the 2.5% and 97.5% quantiles of those means
    index = torch.randint(len(a), (RESAMPLES, len(a)),
                          generator=torch.Generator().manual_seed(0)).numpy()
    means = (b - a)[index].mean(1)
    assert paired["difference"] == pytest.approx((b - a).mean(), abs=1e-14)
    assert paired["ci"] == pytest.approx(list(np.quantile(means, [0.025, 0.975])), abs=1e-14)
    assert paired["sequences"] == 257


def test_sequences_without_a_value_in_a_band_are_left_out_of_both():
    paired = paired_difference([1.0, None, 2.0], [1.5, None, 2.5], RESAMPLES)
    assert paired["sequences"] == 2 and paired["difference"] == pytest.approx(0.5)
    assert paired_difference([None], [None], RESAMPLES) is None


def test_the_record_carries_per_sequence_losses_that_average_to_its_metrics(runs):
    task, batch, preds, a, _ = runs
    m, per_sequence = a["metrics"], a["per_sequence"]
    assert len(per_sequence["loss"]["model"]) == m["sequences"] == len(batch)
    assert np.mean(per_sequence["loss"]["model"]) == pytest.approx(m["loss"]["model"], rel=1e-6)
    assert per_sequence["bands"] == [[1, 8], [9, 64], [65, 80]]
    # a band's gap is the mean over sequences of (model − Bayes) over the band's positions
    losses = (task.position_loss(mixture(preds, 0.9), batch.targets)
              - task.position_loss(preds["bayes"], batch.targets))
    for (first, last), band in zip(per_sequence["bands"], m["gap_by_band"]):
        assert band["gap"] == pytest.approx(float(losses[:, first - 1:last].mean()), rel=1e-9)
        assert band["sequences"] == len(batch)


def test_identical_records_differ_by_zero_and_are_not_distinguishable(runs, tmp_path):
    _, _, _, a, _ = runs
    result = compare(write(tmp_path, "a.json", a), write(tmp_path, "b.json", a))
    for row in result["rows"]:
        assert row["paired"]["difference"] == 0 and row["paired"]["ci"] == [0.0, 0.0]
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0


def test_identical_records_print_not_distinguishable(runs, tmp_path, capsys):
    _, _, _, a, _ = runs
    assert main(["compare", write(tmp_path, "a.json", a), write(tmp_path, "b.json", a)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines()
            if line.startswith(("all", "1–8", "9–64", "65–80"))]
    assert len(rows) == 4
    assert all(line.endswith("not distinguishable at 300 sequences") for line in rows)


def test_a_shifted_record_is_detected_in_both_orders(runs, tmp_path):
    _, _, _, a, _ = runs
    shifted = copy.deepcopy(a)
    shifted["per_sequence"]["loss"]["model"] = [v + 0.01
                                                for v in a["per_sequence"]["loss"]["model"]]
    path_a, path_b = write(tmp_path, "a.json", a), write(tmp_path, "b.json", shifted)
    overall = compare(path_a, path_b)["rows"][0]["paired"]
    assert overall["difference"] == pytest.approx(0.01) and overall["ci"][0] > 0
    assert compare(path_b, path_a)["rows"][0]["paired"]["ci"][1] < 0


def test_a_worse_model_is_found_worse_overall_and_the_gaps_are_the_records(runs, tmp_path,
                                                                          capsys):
    _, _, _, a, b = runs
    assert main(["compare", write(tmp_path, "a.json", a), write(tmp_path, "b.json", b)]) == 0
    out = capsys.readouterr().out
    overall = next(line for line in out.splitlines() if line.startswith("all"))
    assert overall.endswith("mamba better")  # the better model named, not "A"
    result = compare(str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    row = result["rows"][0]
    assert row["paired"]["difference"] == pytest.approx(
        b["metrics"]["bayes_gap"] - a["metrics"]["bayes_gap"], rel=1e-5)


@pytest.mark.parametrize("case, needle", [
    ("other_held_out", "different held-out sets"),
    ("old", "re-evaluate its weights with python -m bench eval"),
    ("failed", "only ok runs"),
    ("text", "text record"),
    ("malformed", "per_sequence.loss.model is not 300 numbers"),
    ("missing", "no such record file"),
    ("not_json", "not valid JSON"),
])
def test_records_that_do_not_pair_are_refused_in_one_line_exit_2(runs, tmp_path, capsys, case,
                                                                  needle):
    _, _, _, a, _ = runs
    b = copy.deepcopy(a)
    if case == "other_held_out":
        b["metrics"]["held_out_digest"] = "0" * 64
    elif case == "old":
        del b["per_sequence"], b["metrics"]["held_out_digest"]
    elif case == "failed":
        b["status"], b["reason"] = "failed", "non-finite loss at step 3"
    elif case == "text":
        names = ["model", *b["metrics"]["roles"]]
        ppl = {n: math.exp(b["metrics"]["loss"][n]) for n in names}
        b["metrics"].update(scoring="perplexity", perplexity=ppl,
                            perplexity_ci={n: [p * 0.99, p * 1.01] for n, p in ppl.items()},
                            bits_per_byte={n: math.log2(p) for n, p in ppl.items()})
        b["per_position"]["loss.model"] = b["per_position"]["gap.model"]
    elif case == "malformed":
        b["per_sequence"]["loss"]["model"] = b["per_sequence"]["loss"]["model"][:-1]
    path_b = write(tmp_path, "b.json", b)
    if case == "missing":
        path_b = str(tmp_path / "absent.json")
    elif case == "not_json":
        (tmp_path / "b.json").write_text("{not json")
    assert main(["compare", write(tmp_path, "a.json", a), path_b]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


@pytest.mark.parametrize("args", [[], ["only.json"], ["a.json", "b.json", "c.json"],
                                  ["bootstrap=10", "x.json"]])
def test_compare_takes_exactly_two_record_files(args, capsys):
    assert main(["compare", *args]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_different_reference_on_the_same_sequences_is_said(runs, tmp_path, capsys):
    _, _, _, a, b = runs
    b = copy.deepcopy(b)
    b["metrics"]["loss"]["bayes"] += 0.001  # e.g. another quadrature grid of the Bayes predictor
    assert main(["compare", write(tmp_path, "a.json", a), write(tmp_path, "b.json", b)]) == 0
    out = capsys.readouterr().out
    assert "gap references differ" in out and "= gap B − gap A" not in out
    assert main(["compare", str(tmp_path / "a.json"), write(tmp_path, "a2.json", a)]) == 0
    out = capsys.readouterr().out
    assert "references differ" not in out and "= gap B − gap A" in out


def test_several_models_over_shared_seeds_are_paired_by_seed_and_the_winner_named(tmp_path,
                                                                                 capsys):
    """Three models on seeds 0-2 (and a fourth seed of one of them, not shared): each mean gap
    with its t-interval, each pair's mean per-seed difference with its t-interval (widened by
    the records' own held-out intervals), a named verdict, and the best overall; the unshared
    seed is left out."""
    from test_claims import MAMBA, put, record
    base = [a for a in MAMBA if not a.startswith("model")]
    gaps = {"mamba": [0.010, 0.012, 0.011], "transformer": [0.030, 0.041, 0.035],
            "lstm": [0.031, 0.040, 0.036]}
    out = tmp_path / "r"
    put(out, *(record([*base, f"model={m}"], seed=s, gap=g)
               for m, values in gaps.items() for s, g in enumerate(values)),
        record([*base, "model=lstm"], seed=3, gap=0.5))
    assert main(["compare", *base, "model=mamba,transformer,lstm", f"out_dir={out}"]) == 0
    printed = capsys.readouterr().out
    assert "3 seeds in common (0, 1, 2)" in printed
    rows = {line.split(" | ")[0]: line for line in printed.splitlines() if line.startswith("| ")}
    mean, half = across_seeds(gaps["lstm"])
    assert f"| lstm | {fmt_sig(mean)} | [{fmt_sig(mean - half)}, {fmt_sig(mean + half)}] |" \
        in printed
    differences = [b - a for a, b in zip(gaps["mamba"], gaps["transformer"])]
    mean, half = across_seeds(differences)
    # records without per-sequence losses: the held-out noise from their own intervals (±20%)
    half = math.hypot(half, 0.2 * (sum(gaps["mamba"]) + sum(gaps["transformer"])) / 3)
    assert rows["| B = transformer, A = mamba"].endswith(
        f"| {fmt_sig(mean)} | [{fmt_sig(mean - half)}, {fmt_sig(mean + half)}] | mamba better |")
    assert rows["| B = lstm, A = transformer"].endswith("| not distinguishable at 3 seeds |")
    assert "best: mamba (better than every other, paired by seed)" in printed



def test_seeds_that_agree_on_a_noisy_held_out_set_are_widened_by_its_noise(tmp_path, capsys):
    """Two models whose per-seed gaps differ by the same 0.004 on every seed: across seeds alone
    B is worse. But on the 64 held-out sequences the difference swings ±0.1 from sequence to
    sequence, so the held-out set says little: the interval widens by the bootstrap over its
    sequences (in quadrature), and the verdict is "not distinguishable". Where the sequences
    agree with the mean, the verdict stands."""
    from test_claims import MAMBA, put, record
    base = [a for a in MAMBA if not a.startswith("model")]
    generator = torch.Generator().manual_seed(5)
    hard = (torch.rand(64, generator=generator, dtype=torch.float64) + 0.5).tolist()
    swing = (torch.randn(64, generator=generator, dtype=torch.float64) * 0.1).tolist()

    def with_losses(model, seed, losses):
        rec = record([*base, f"model={model}"], seed=seed, gap=sum(losses) / 64 - 0.5)
        rec["metrics"].update(sequences=64, held_out_digest="d" * 64, gap_by_band=[])
        rec["per_sequence"] = {"bands": [], "loss": {"model": losses},
                               "band_loss": {"model": []}}
        return rec

    def verdict_of(b_losses) -> tuple[str, float]:
        out = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
        put(out, *(with_losses("mamba", s, [h + 0.001 * s for h in hard]) for s in range(3)),
            *(with_losses("transformer", s, [b + 0.001 * s for b in b_losses])
              for s in range(3)))
        assert main(["compare", *base, "model=mamba,transformer", f"out_dir={out}"]) == 0
        row = next(line for line in capsys.readouterr().out.splitlines()
                   if line.startswith("| B = transformer"))
        lo, hi = (float(x) for x in row.split(" | ")[2].strip("[]").split(", "))
        return row.split(" | ")[3].rstrip(" |"), (hi - lo) / 2

    shift = sum(swing) / 64
    noisy, half = verdict_of([h + 0.004 - shift + w for h, w in zip(hard, swing)])
    assert noisy == "not distinguishable at 3 seeds"
    differences = torch.tensor([0.004 - shift + w for w in swing], dtype=torch.float64)
    lo, hi = bootstrap_ci(differences, TrainerConfig.bootstrap)
    assert half == pytest.approx((hi - lo) / 2, rel=0.02)  # the seeds add ~0 in quadrature
    steady, _ = verdict_of([h + 0.004 for h in hard])
    assert steady == "mamba better"


def test_records_without_per_sequence_losses_widen_by_their_own_intervals(tmp_path, capsys):
    """Gaps 0.004 apart on every seed, records without per-sequence losses whose own intervals
    are ±0.002 and ±0.003: the seeds alone would say B is worse, but they share one held-out
    set, whose noise the records' own intervals bound (unpaired: ±0.005 in quadrature with the
    seeds'), and the verdict is "not distinguishable"; with intervals of ±1e-4 it stands."""
    from test_claims import MAMBA, put, record
    base = [a for a in MAMBA if not a.startswith("model")]

    def run(model, seed, gap, half):
        rec = record([*base, f"model={model}"], seed=seed, gap=gap)
        rec["metrics"].update(sequences=64, held_out_digest="d" * 64,
                              bayes_gap_ci=[gap - half, gap + half])
        return rec

    def compared(half_a, half_b) -> tuple[str, float, str]:
        out = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
        put(out, *(run("mamba", s, 0.01 + 0.0001 * s, half_a) for s in range(3)),
            *(run("transformer", s, 0.014 + 0.0001 * s + 1e-5 * (s == 1), half_b)
              for s in range(3)))
        assert main(["compare", *base, "model=mamba,transformer", f"out_dir={out}"]) == 0
        printed = capsys.readouterr().out
        row = next(line for line in printed.splitlines() if line.startswith("| B = transformer"))
        lo, hi = (float(x) for x in row.split(" | ")[2].strip("[]").split(", "))
        return row.split(" | ")[3].rstrip(" |"), (hi - lo) / 2, printed

    verdict, half, printed = compared(0.002, 0.003)
    assert verdict == "not distinguishable at 3 seeds" and half == pytest.approx(0.005, rel=0.01)
    assert "bounded unpaired by the records' own intervals" in printed
    verdict, half, _ = compared(1e-4, 1e-4)
    assert verdict == "mamba better" and half < 0.001
