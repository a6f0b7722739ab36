"""Paired evaluation: gaps, intervals and curves against direct computations."""
import math

import pytest
import torch

from bench.training.evaluate import gap_closed, position_scores, score
from bench.config.formats import ROUNDING_GAP, fmt_loss, fmt_sig, loss_resolution
from tasks.lgssm_colored import LGSSMColoredConfig, LGSSMColoredTask
from tasks.markov import MarkovConfig, MarkovTask
from tasks.stats import T_975, across_seeds, t_quantile, bootstrap_ci, position_means


@pytest.fixture(scope="module")
def scored():
    task = MarkovTask(MarkovConfig(order=1, vocab_size=3, seq_len=48))
    batch = task.held_out(400)
    preds = {name: ref.predict(batch) for name, ref in task.references().items()}
    preds["model"] = preds["unigram"]  # a "model" that is exactly the unigram baseline
    return task, batch, preds, score(task, batch, preds, resamples=500)


def test_gap_is_the_paired_loss_difference(scored):
    task, batch, preds, result = scored
    m = result["metrics"]
    assert m["gap_reference"] == "bayes"
    direct = (task.position_loss(preds["model"], batch.targets)
              - task.position_loss(preds["bayes"], batch.targets)).mean()
    assert m["bayes_gap"] == pytest.approx(float(direct), abs=1e-12)
    assert m["bayes_gap"] == pytest.approx(m["gap"]["unigram"], abs=1e-15)
    assert m["gap"]["bayes"] == 0 and m["gap_ci"]["bayes"] == [0.0, 0.0]
    assert m["l1_to_reference"]["bayes"] == 0
    curve = result["per_position"]["gap.model"]
    assert sum(curve) / len(curve) == pytest.approx(m["bayes_gap"], abs=1e-12)


def test_bootstrap_interval_matches_the_normal_approximation():
    values = torch.randn(2000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    lo, hi = bootstrap_ci(values, resamples=4000)
    half = 1.96 * values.std() / math.sqrt(len(values))
    assert lo < values.mean() < hi
    assert (hi - lo) / 2 == pytest.approx(float(half), rel=0.1)


def test_position_means_skip_unscored_positions():
    values = torch.tensor([[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert position_means(values, mask) == [2.0, None, 3.0]


def test_t_interval_across_seeds():
    scipy_stats = pytest.importorskip("scipy.stats")
    for df, q in T_975.items():
        assert q == pytest.approx(scipy_stats.t.ppf(0.975, df), abs=1e-3)
    for df in (1, 10, 30, 31, 40, 100, 1000):
        assert t_quantile(df) == pytest.approx(scipy_stats.t.ppf(0.975, df), abs=1e-3)
    mean, half = across_seeds([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(T_975[2] * 1.0 / math.sqrt(3))
    assert across_seeds([0.5]) == (0.5, None)


def test_beating_bayes_is_flagged_only_when_the_held_out_set_follows_the_prior():
    from bench.config.formats import is_suspicious
    below = {"gap_reference_role": "bayes", "bayes_gap_ci": [-0.02, -0.01]}
    assert is_suspicious({**below, "held_out_from_prior": True})
    assert not is_suspicious({**below, "held_out_from_prior": False})
    assert not is_suspicious({**below, "gap_reference_role": "bound", "held_out_from_prior": True})
    assert not is_suspicious({**below, "bayes_gap_ci": [-0.01, 0.01], "held_out_from_prior": True})
    # the Bayes predictor itself, in float32 (measured: mambazero_constructed on markov)
    rounding = {**below, "bayes_gap_ci": [-8.6e-10, -3.8e-10], "held_out_from_prior": True}
    assert not is_suspicious(rounding)


def test_an_infinite_loss_at_an_unscored_position_does_not_poison_the_gap(scored):
    task, batch, preds, _ = scored
    masked = type(batch)(batch.inputs, batch.targets, batch.loss_mask.clone(), batch.latent)
    masked.loss_mask[:, 0] = False
    model = preds["bayes"].clone()
    model[:, 0] = float("-inf")  # log-probability 0 of everything, where nothing is scored
    m = score(task, masked, {**preds, "model": model}, resamples=100)["metrics"]
    assert m["bayes_gap"] == pytest.approx(0.0, abs=1e-12)


def test_vector_scores_carry_the_signed_error_zero_where_unscored(scored):
    """A vector task's scores keep prediction - target (float32) for its summary; tokens have
    none."""
    task = LGSSMColoredTask(LGSSMColoredConfig(seq_len=16))
    batch = task.held_out(4)
    batch.loss_mask[:, :3] = False
    found = position_scores(task, batch, batch.targets.double() + 0.25, None)
    assert found["error"].dtype == torch.float32 and found["error"].shape == (4, 16, 1)
    assert (found["error"][:, :3] == 0).all() and (found["error"][:, 3:] == 0.25).all()
    markov, markov_batch, predictions, _ = scored
    assert "error" not in position_scores(markov, markov_batch, predictions["bayes"],
                                          predictions["bayes"].exp())


def test_gap_closed_and_whether_the_interval_excludes_zero_follow_their_definitions(scored):
    task, batch, preds, _ = scored
    halfway = torch.log((preds["bayes"].exp() + preds["unigram"].exp()) / 2)
    m = score(task, batch, {**preds, "model": halfway}, resamples=500)["metrics"]
    baselines = {n: m["gap"][n] for n, role in m["roles"].items() if role == "baseline"}
    best = min(baselines, key=baselines.get)
    assert m["gap_closed"]["baseline"] == best == "unigram"
    assert m["gap_closed"]["fraction"] == pytest.approx(1 - m["bayes_gap"] / baselines[best])
    assert 0 < m["gap_closed"]["fraction"] < 1
    lo, hi = m["bayes_gap_ci"]
    assert m["gap_excludes_zero"] is True and lo > 0
    bayes_itself = score(task, batch, {**preds, "model": preds["bayes"]}, resamples=500)["metrics"]
    assert bayes_itself["gap_excludes_zero"] is False
    assert bayes_itself["gap_closed"]["fraction"] == 1


def test_gap_closed_skips_bounds_and_non_finite_baselines_and_needs_a_gap_to_close():
    roles = {"bayes": "bayes", "oracle": "bound", "a": "baseline", "b": "baseline",
             "broken": "baseline"}
    gaps = {"bayes": 0.0, "oracle": -0.5, "a": 0.4, "b": 0.2, "broken": math.nan, "model": 0.05}
    assert gap_closed(gaps, roles) == {"baseline": "b", "gap": 0.2, "fraction": pytest.approx(0.75)}
    assert gap_closed({**gaps, "a": 0.0, "b": 0.1}, roles)["fraction"] is None
    assert gap_closed(gaps, {"bayes": "bayes", "oracle": "bound"}) is None
    # a Monte Carlo run of the Bayes estimate (lgssm's bayes_run1) sits at gap ~0: not a baseline
    replicated = {**roles, "bayes_run1": "replicate"}
    assert gap_closed({**gaps, "bayes_run1": -1e-4}, replicated)["baseline"] == "b"


@pytest.mark.parametrize("value, kwargs, text", [
    (0.000726, {}, "0.000726"), (7.255e-05, {}, "7.26e-05"), (-0.0001234, {}, "-0.000123"),
    (4.8097, {}, "4.81"), (None, {}, "-"), (math.nan, {}, "-"), (math.inf, {}, "inf"),
    (1.4321402, {"resolution": 0.000726}, "1.432140"), (1.43, {"resolution": 0.5}, "1.430"),
    (12.0, {"resolution": 3000.0}, "12"), (0.5, {"resolution": 0.0}, "0.5"),
])
def test_fmt_sig_gives_significant_figures_or_the_decimals_a_difference_needs(value, kwargs,
                                                                              text):
    assert fmt_sig(value, **kwargs) == text


def test_losses_show_the_models_gap_and_ignore_differences_within_rounding():
    assert loss_resolution({"bayes": 0.0, "bound": -5e-5, "model": 7.26e-4}) == 7.26e-4
    assert loss_resolution({"bayes": 0.0, "bound": -5e-15, "zero": 0.164}) == 0.164
    assert loss_resolution({"bayes": 0.0, "model": 1e-9}) == ROUNDING_GAP
    assert fmt_loss(1.4321402, 7.26e-4) == "1.43214"  # the gap to two significant figures
    assert fmt_loss(1.8345, 3.82) == "1.8345" and fmt_loss(None, 0.1) == "-"


def test_a_run_summary_says_what_the_gap_means(scored, capsys):
    """Beside the gap: whether its interval excludes 0, the share of the best baseline's gap
    closed and the gap by context band, each as the record holds it."""
    from bench.reports.report import print_run
    task, batch, preds, _ = scored
    halfway = torch.log((preds["bayes"].exp() + preds["unigram"].exp()) / 2)
    m = score(task, batch, {**preds, "model": halfway}, resamples=500)["metrics"]
    record = {"metrics": m, "model": {"name": "mamba"}, "task": {"name": "markov"},
              "train": {"steps": 1, "wall_time_s": 1.0, "device": "cpu"}, "params": 1,
              "state_size": 1, "wall_time_s": 1.0}
    print_run(record, "r.json")
    out = capsys.readouterr().out
    assert "gap > 0: the model is measurably worse than Bayes" in out
    share = fmt_sig(100 * m["gap_closed"]["fraction"], 2,
                    resolution=100 * (1 - m["gap_closed"]["fraction"]))
    assert f"gap closed: {share}% of the gap of the best baseline, unigram" in out
    bands = ", ".join(f"{b['positions'][0]}–{b['positions'][1]} {fmt_sig(b['gap'])}"
                      for b in m["gap_by_band"])
    assert f"gap by position: {bands}\n" in out


def test_a_run_prints_its_tasks_own_metrics_only_when_asked(scored, capsys):
    """lgssm_colored's probes were 20 lines between the table and the headline: behind
    details=true now, and one line says where they are."""
    from bench.reports.report import print_run
    task, batch, preds, _ = scored
    m = score(task, batch, {**preds, "model": preds["unigram"]}, resamples=100)["metrics"]
    m["task"] = {"context_lengths": [8, 16], "mse": {"model": [1.0, 2.0]}, "eval_rho": 0.95,
                 "mse_stderr": {"model": [0.1, 0.1]}}
    record = {"metrics": m, "model": {"name": "mamba"}, "task": {"name": "markov"},
              "train": {"steps": 1, "wall_time_s": 1.0, "device": "cpu"}, "params": 1,
              "state_size": 1, "wall_time_s": 1.0}
    print_run(record, "r.json")
    out = capsys.readouterr().out
    assert "mse at context length" not in out and "eval_rho" not in out
    assert ("(2 more metrics of the task in the record's metrics.task; details=true prints "
            "them)\nBayes gap") in out
    print_run(record, "r.json", details=True)
    out = capsys.readouterr().out
    assert "mse at context length 8 16:\n  model                1 2\n" in out
    assert "eval_rho: 0.95" in out and "more metrics" not in out
