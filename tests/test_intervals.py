"""The intervals that records carry beside the numbers claims read (a claim decides nothing on a
number whose noise it does not know): each against its definition, and where it is a
bootstrap or a bound, against its coverage on planted data."""
import math

import pytest
import torch

from bench.training.evaluate import score
from tasks.lgssm import pooled_std_interval
from tasks.lgssm_colored import loglog_slope, loglog_slope_interval
from tasks.markov import MarkovConfig, MarkovTask, smallest_mean_interval
from tasks.stats import (RESAMPLES, percentile_interval, position_means, position_stderrs,
                         ratio_interval, resample_counts)


def test_resample_counts_are_the_bootstraps_draws_and_repeat_from_their_seed():
    counts = resample_counts(50, resamples=200)
    assert counts.shape == (200, 50) and bool((counts.sum(1) == 50).all())
    assert torch.equal(counts, resample_counts(50, resamples=200))
    assert not torch.equal(counts, resample_counts(50, resamples=200, seed=1))
    assert RESAMPLES >= 1000


def test_position_stderrs_are_the_standard_error_over_the_scored_sequences():
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(30, 5, generator=generator, dtype=torch.float64)
    mask = torch.ones(30, 5)
    mask[:10, 2] = 0  # 20 sequences scored at position 2
    mask[1:, 4] = 0  # one at position 4: no error bar
    errors = position_stderrs(values, mask)
    scored = values[10:, 2]
    assert errors[2] == pytest.approx(float(scored.std() / math.sqrt(20)), rel=1e-3)
    assert errors[0] == pytest.approx(float(values[:, 0].std() / math.sqrt(30)), rel=1e-3)
    assert errors[4] is None
    assert position_means(values, mask)[2] == pytest.approx(float(scored.mean()))


def test_ratio_interval_holds_a_ratio_of_sums_and_its_noise():
    # every sequence with the same ratio: no noise, a point
    assert ratio_interval(torch.tensor([2.0, 4.0, 6.0]), torch.tensor([1.0, 2.0, 3.0])) == [
        2.0, 2.0]
    generator = torch.Generator().manual_seed(1)
    sums = torch.rand(400, generator=generator, dtype=torch.float64)
    counts = torch.ones(400, dtype=torch.float64)
    lo, hi = ratio_interval(sums, counts)
    # a mean of uniforms: the percentile interval is about ±1.96 standard errors
    half = 1.96 * float(sums.std()) / math.sqrt(400)
    assert lo < float(sums.mean()) < hi and (hi - lo) / 2 == pytest.approx(half, rel=0.15)
    assert percentile_interval(torch.tensor([1.0, math.nan])) is None


def test_a_scores_relative_gap_and_curves_carry_their_intervals():
    task = MarkovTask(MarkovConfig(order=1, vocab_size=3, seq_len=48))
    batch = task.held_out(300)
    predictions = {name: ref.predict(batch) for name, ref in task.references().items()}
    predictions["model"] = predictions["unigram"]
    result = score(task, batch, predictions, resamples=500)
    m = result["metrics"]
    lo, hi = m["relative_gap_ci"]
    assert lo < m["relative_gap"] < hi
    # the ratio's interval is the gap's scaled by the reference's loss, to first order
    gap_lo, gap_hi = m["bayes_gap_ci"]
    assert (hi - lo) == pytest.approx((gap_hi - gap_lo) / m["loss"]["bayes"], rel=0.3)
    for name in ("accuracy", "l1_to_reference"):
        low, high = m[f"{name}_ci"]["model"]
        assert low <= m[name]["model"] <= high
    assert set(result["per_position_stderr"]) == set(result["per_position"])
    assert all(e is not None and e >= 0 for e in result["per_position_stderr"]["loss.model"])


def test_the_smallest_mean_interval_covers_the_smallest_true_mean():
    """Positions with true means 0.95 + 0.01 t, noise 0.05: the smallest true mean (0.95) lies
    in the interval in at least 95% of 200 held-out sets, the estimate in every one."""
    generator = torch.Generator().manual_seed(2)
    truth = 0.95 + 0.01 * torch.arange(16, dtype=torch.float64)
    covered = 0
    for _ in range(200):
        values = truth + 0.05 * torch.randn(100, 16, generator=generator, dtype=torch.float64)
        lo, hi = smallest_mean_interval(values)
        covered += lo <= 0.95 <= hi
        assert lo <= float(values.mean(0).min()) <= hi
    assert covered >= 190
    assert smallest_mean_interval(torch.ones(1, 4)) is None


def test_the_slope_interval_is_the_bootstrap_of_the_fitted_slope():
    """Excess risks 1/k with noise: the interval holds the fitted slope and about -1; a bin
    whose mean is not positive on some resample leaves the slope without an interval."""
    ks = [8, 16, 32, 64, 128, 256]
    generator = torch.Generator().manual_seed(3)
    per_sequence = torch.tensor([1.0 / k for k in ks], dtype=torch.float64) * (
        1 + 0.3 * torch.randn(512, len(ks), generator=generator, dtype=torch.float64))
    slope = loglog_slope(ks, per_sequence.mean(0).tolist())
    lo, hi = loglog_slope_interval(ks, per_sequence)
    assert lo < slope < hi and lo < -1.0 < hi and hi - lo < 0.2
    centred = per_sequence - per_sequence.mean(0)  # means about 0: log undefined
    assert loglog_slope_interval(ks, centred) is None


def test_the_pooled_std_interval_holds_the_pooled_standard_deviation():
    generator = torch.Generator().manual_seed(4)
    errors = 1.4 * torch.randn(512, 2, generator=generator, dtype=torch.float64)
    lo, hi = pooled_std_interval(errors)
    assert lo < float(errors.flatten().std()) < hi and lo < 1.4 < hi
    # about ±1.96 standard errors of a standard deviation from 1,024 values
    assert (hi - lo) / 2 == pytest.approx(1.96 * 1.4 / math.sqrt(2 * 1024), rel=0.3)
