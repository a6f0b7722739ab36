"""tasks/linreg.py: the sampler against its definition (paper 002 §4.1, A.5/A.6), both prompt
layouts, the ridge posterior mean against Monte-Carlo posterior means, the MSE-optimality of the
GD step sizes, and the ordering of the references on held-out data."""
import dataclasses
import math
from pathlib import Path

import pytest
import torch
import yaml

from tasks.stats import sequence_means
from tasks import task_families
from conftest import check_score_last
from tasks.base import make_generator
from tasks.linreg import (TUNING_STREAM, TUNING_TASKS, LinearRegression, constructed_tokens,
                          gd1_step_size, interleave, split_interleaved)

Z = 5.0  # tolerance of the statistical checks, in standard errors
CONF = Path(__file__).parents[1] / "conf/task"



def small(**overrides) -> LinearRegression:
    values = dict(seq_len=16, n_features=3, n_outputs=1, noise_std=0.5, gd_steps=[1, 2])
    values.update(overrides)
    return LinearRegression(LinearRegression.Config(**values))


def within(samples: torch.Tensor, expected: float) -> bool:
    stderr = samples.std().item() / math.sqrt(samples.numel())
    return abs(samples.mean().item() - expected) <= Z * stderr


def decoded(task: LinearRegression, batch):
    """x (B, n, f), y (B, n, N) in float64 straight from the interleaved inputs."""
    c = task.config
    return split_interleaved(batch.inputs.double(), c.n_features, c.n_outputs)


@pytest.mark.parametrize("name", ["linreg", "linreg_tokens"])
def test_family_registered_and_yaml_lists_every_field(name):
    assert task_families()["linreg"] is LinearRegression
    text = (CONF / f"{name}.yaml").read_text()
    assert text.startswith("# ")
    values = yaml.safe_load(text)
    assert values.pop("family") == "linreg"
    assert set(values) == {f.name for f in dataclasses.fields(LinearRegression.Config)}
    assert values["prompt"] == ("tokens" if name == "linreg_tokens" else "interleaved")
    LinearRegression.Config(**values)


def test_invalid_config_is_rejected():
    with pytest.raises(ValueError, match="prompt"):
        LinearRegression.Config(prompt="pairs")
    with pytest.raises(ValueError):
        LinearRegression.Config(gd_steps=[0])


def test_sampler_moments_match_the_definition():
    """x_i ~ U(-1, 1): mean 0, variance 1/3, support [-1, 1]; W ~ N(0, I); y - W x ~ N(0, σ²)."""
    task = small(n_features=3, n_outputs=2, noise_std=0.5, seq_len=12)
    batch = task.sample(6000, make_generator(11))
    x, y = decoded(task, batch)
    assert x.abs().max() <= 1
    assert within(x, 0.0) and within(x ** 2, 1 / 3)
    weights = batch.latent["weights"].double()  # (B, N, f)
    assert weights.shape == (6000, 2, 3)
    assert within(weights, 0.0) and within(weights ** 2, 1.0)
    assert within(weights[:, 0, 0] * weights[:, 1, 2], 0.0)  # independent entries
    residual = y - torch.einsum("bof,bkf->bko", weights, x)
    assert within(residual, 0.0) and within(residual ** 2, 0.25)


def test_interleaved_and_token_layouts():
    f, n_out, n = 3, 2, 6
    inter = small(n_features=f, n_outputs=n_out, seq_len=2 * n)
    tokens = small(n_features=f, n_outputs=n_out, seq_len=n, prompt="tokens")
    a = inter.sample(4, make_generator(5))
    b = tokens.sample(4, make_generator(5))  # same draws: same x, y, W
    assert a.inputs.shape == (4, 2 * n, f + n_out + 1) and inter.input_dim == f + n_out + 1
    assert b.inputs.shape == (4, n, n_out * f + f) and tokens.input_dim == n_out * f + f
    x, y = a.inputs[:, 0::2, :f], a.inputs[:, 1::2, f:f + n_out]
    assert torch.equal(a.inputs[:, 0::2, -1], torch.ones(4, n))  # x-token flag
    assert torch.equal(a.inputs[:, 1::2, -1], torch.zeros(4, n))
    assert torch.equal(a.inputs[:, 0::2, f:], torch.cat([torch.zeros(4, n, n_out),
                                                        torch.ones(4, n, 1)], -1))
    assert torch.equal(a.inputs[:, 1::2, :f], torch.zeros(4, n, f))
    assert torch.equal(a.targets[:, 0::2], y) and torch.equal(a.targets[:, 1::2], 0 * y)
    assert a.loss_mask[:, 0::2].all() and not a.loss_mask[:, 1::2].any()
    # tokens: position 0 is [0, x_0]; position t is [vec(y_{t-1} x_{t-1}ᵀ), x_t], target y_t.
    assert torch.equal(b.latent["weights"], a.latent["weights"])
    assert torch.equal(b.inputs[:, :, n_out * f:], x) and torch.equal(b.targets, y)
    assert torch.equal(b.inputs[:, 0, :n_out * f], torch.zeros(4, n_out * f))
    for t in range(1, n):
        outer = torch.einsum("bo,bf->bof", y[:, t - 1], x[:, t - 1]).reshape(4, -1)
        assert torch.allclose(b.inputs[:, t, :n_out * f], outer, rtol=1e-6, atol=0)
    assert b.loss_mask.all()
    # Every reference predicts the same y_t from both layouts (up to float32 products).
    refs_a, refs_b = inter.references(), tokens.references()
    for name in refs_a:
        pa, pb = refs_a[name].predict(a)[:, 0::2], refs_b[name].predict(b)
        assert torch.allclose(pa, pb, rtol=1e-4, atol=1e-5), name


@pytest.mark.parametrize("prompt,seq_len", [("interleaved", 15), ("tokens", 8)])
def test_references_are_causal(prompt, seq_len):
    task = small(prompt=prompt, seq_len=seq_len, n_outputs=2)
    batch = task.sample(8, make_generator(7))
    cut = seq_len // 2
    changed = dataclasses.replace(batch, inputs=batch.inputs.clone())
    changed.inputs[:, cut + 1:] = torch.randn_like(changed.inputs[:, cut + 1:])
    for name, ref in task.references().items():
        before, after = ref.predict(batch), ref.predict(changed)
        assert before.shape == (8, seq_len, 2)
        assert torch.equal(before[:, :cut + 1], after[:, :cut + 1]), name


def test_ridge_posterior_mean_equals_exact_gaussian_posterior_samples():
    """Posterior samples by pathwise conditioning (Matheron's rule), an exact sampler of W | data
    built from the kernel form Xᵀ(XXᵀ + σ²I)⁻¹, independent of the ridge/eigen code path."""
    for noise in (0.5, 0.0):
        task = small(n_features=3, n_outputs=2, noise_std=noise, seq_len=20)
        batch = task.sample(2, make_generator(21))
        bayes = task.references()["bayes"].predict(batch)[:, 0::2]
        x, y = decoded(task, batch)
        gen = make_generator(22)
        draws = 200_000
        for b in range(2):
            for j in ((1, 2, 5, 9) if noise else (1, 2)):  # noiseless: XXᵀ invertible for j <= f
                X, Y = x[b, :j], y[b, :j]  # (j, f), (j, N)
                prior = torch.randn(draws, 2, 3, generator=gen, dtype=torch.float64)
                eps = noise * torch.randn(draws, j, 2, generator=gen, dtype=torch.float64)
                kernel = X @ X.T + noise ** 2 * torch.eye(j, dtype=torch.float64)
                residual = Y - torch.einsum("jf,sof->sjo", X, prior) - eps
                posterior = prior + torch.einsum("jf,jk,sko->sof", X, torch.linalg.inv(kernel),
                                                 residual)
                samples = torch.einsum("sof,f->so", posterior, x[b, j])
                stderr = samples.std(0) / math.sqrt(draws)
                gap = (samples.mean(0) - bayes[b, j]).abs()
                assert (gap <= Z * stderr + 1e-9).all(), (noise, b, j, gap, stderr)
                assert (stderr < 0.01).all()  # the check is tight


def test_ridge_posterior_mean_equals_importance_sampling_from_the_prior():
    """Self-normalised importance sampling with the N(0, I) prior as proposal and the Gaussian
    likelihood as weight: uses only the model's definition."""
    task = small(n_features=2, noise_std=0.5, seq_len=8)
    batch = task.sample(1, make_generator(31))
    bayes = task.references()["bayes"].predict(batch)[0, 0::2, 0]
    x, y = decoded(task, batch)
    draws = 1_000_000
    w = torch.randn(draws, 2, generator=make_generator(32), dtype=torch.float64)
    for j in (1, 2, 3):
        log_weight = -((y[0, :j, 0] - w @ x[0, :j].T) ** 2).sum(-1) / (2 * 0.25)
        weight = torch.softmax(log_weight, 0)
        prediction = w @ x[0, j]
        estimate = (weight * prediction).sum()
        stderr = ((weight ** 2 * (prediction - estimate) ** 2).sum()).sqrt()  # delta method
        assert abs(estimate - bayes[j]) <= Z * stderr, (j, estimate, bayes[j], stderr)
        assert stderr < 0.01


def one_step_factor_estimate(task: LinearRegression, batch, j: int):
    """The empirical risk-minimising c for ŷ = c x_jᵀ Σ_{k<j} x_k y_k (ratio of means) and its
    delta-method standard error."""
    x, y = decoded(task, batch)
    g = torch.einsum("bf,bkf,bk->b", x[:, j], x[:, :j], y[:, :j, 0])
    target = y[:, j, 0]
    best = (g * target).mean() / (g * g).mean()
    stderr = (g * target - best * g * g).std() / (math.sqrt(len(g)) * (g * g).mean())
    return best.item(), stderr.item()


def test_gd1_step_size_is_mse_optimal():
    task = small(n_features=3, noise_std=0.3, seq_len=16)
    batch = task.sample(40000, make_generator(41))
    eta = task.step_sizes(1)
    assert torch.equal(eta, gd1_step_size(torch.arange(8), 3, 0.3))
    x, y = decoded(task, batch)
    for j in (1, 2, 4, 7):
        best, stderr = one_step_factor_estimate(task, batch, j)
        c = eta[j].item() / j
        assert abs(best - c) <= Z * stderr, (j, best, c, stderr)
        assert stderr < 0.02 * c
        g = torch.einsum("bf,bkf,bk->b", x[:, j], x[:, :j], y[:, :j, 0])
        risk = lambda factor: ((factor * g - y[:, j, 0]) ** 2).mean()  # noqa: E731
        assert risk(c) < risk(0.9 * c) and risk(c) < risk(1.1 * c)


def explicit_gd(x, y, j: int, eta: float, steps: int) -> torch.Tensor:
    """Predictions at x_j of `steps` iterations of W ← W - (η/j) Σ_k (W x_k - y_k) x_kᵀ from 0."""
    weights = torch.zeros(x.shape[0], y.shape[-1], x.shape[-1], dtype=torch.float64)
    for _ in range(steps):
        residual = torch.einsum("bof,bkf->bko", weights, x[:, :j]) - y[:, :j]
        weights = weights - eta / j * torch.einsum("bko,bkf->bof", residual, x[:, :j])
    return torch.einsum("bof,bf->bo", weights, x[:, j])


def test_multi_step_step_sizes_minimise_the_tuning_risk():
    task = small(n_features=3, noise_std=0.3, seq_len=16, gd_steps=[1, 2, 4])
    tuning = task.sample(TUNING_TASKS, make_generator(TUNING_STREAM, 0))
    x, y = decoded(task, tuning)
    # K = 1: the numerical tuner recovers the closed form within the tuning sample's error,
    # and the exact minimiser of the sample risk (a ratio of means) to optimiser precision.
    tuned = task.tune_step_sizes(1)
    for j in (1, 3, 6):
        best, stderr = one_step_factor_estimate(task, tuning, j)
        assert tuned[j].item() / j == pytest.approx(best, rel=1e-6)
        assert abs(tuned[j].item() / j - task.step_sizes(1)[j].item() / j) <= Z * stderr
    # K > 1: no step size on a dense grid beats the tuned one on the tuning sample, where the
    # risk is evaluated by explicit GD iterations (not the eigen-filter of the task).
    for steps in (2, 4):
        eta = task.step_sizes(steps)
        for j in (1, 4, 7):
            def risk(e: float) -> float:
                return (explicit_gd(x, y, j, e, steps) - y[:, j]).pow(2).mean().item()
            grid = torch.logspace(math.log10(eta[j] / 10), math.log10(eta[j] * 10), 161)
            assert risk(eta[j].item()) <= min(risk(e.item()) for e in grid) * (1 + 1e-9)
    # The gd<K> references are K explicit GD steps with these step sizes.
    batch = task.sample(16, make_generator(43))
    xb, yb = decoded(task, batch)
    for steps in (1, 2, 4):
        prediction = task.references()[f"gd{steps}"].predict(batch)[:, 0::2]
        for j in (0, 1, 5, 7):
            expected = explicit_gd(xb, yb, max(j, 1), task.step_sizes(steps)[j].item(), steps)
            assert torch.allclose(prediction[:, j], expected, atol=1e-10), (steps, j)


@pytest.mark.parametrize("noise", [0.0, 0.5])
def test_bayes_has_the_lowest_held_out_loss(noise):
    task = LinearRegression(LinearRegression.Config(noise_std=noise))  # f = 5, 16 examples
    batch = task.held_out(2000)
    losses = {name: sequence_means(task.position_loss(ref.predict(batch), batch.targets.double()),
                                   batch.loss_mask)
              for name, ref in task.references().items()}
    bayes = losses.pop("bayes")
    oracle = losses.pop("oracle")
    assert within(oracle, noise ** 2) if noise else oracle.max() < 1e-10
    for name, loss in losses.items():
        diff = loss - bayes
        if name == "ols" and noise == 0:
            assert diff.abs().max() < 1e-6  # noiseless: the posterior mean is least squares
            continue
        assert diff.mean() > 0, name
        if name != "ols":  # least squares has infinite risk at j = f, f + 1: no z-score
            assert diff.mean() > Z * diff.std() / math.sqrt(len(diff)), name


@pytest.mark.parametrize("prompt,seq_len,last", [("interleaved", 16, 14), ("interleaved", 15, 14),
                                                 ("tokens", 8, 7)])
def test_score_last_scores_only_the_final_query(prompt, seq_len, last):
    every = small(prompt=prompt, seq_len=seq_len, n_outputs=2)
    check_score_last(every, small(prompt=prompt, seq_len=seq_len, n_outputs=2, score="last"),
                     last)
    with pytest.raises(ValueError, match="score must be one of all, last"):
        small(score="first")


def test_eval_x_scale_scales_only_the_held_out_inputs():
    """Paper 002 Fig. 1D/2D: held-out x ~ U(-α, α)^f. The set at α is the set at 1 with every x
    multiplied by α (same W and noise); training batches do not change."""
    base, scaled = small(noise_std=0.0), small(noise_std=0.0, eval_x_scale=4.0)
    a, b = base.held_out(64), scaled.held_out(64)
    xa, ya = decoded(base, a)
    xb, yb = decoded(scaled, b)
    assert torch.equal(b.latent["weights"], a.latent["weights"])
    assert torch.equal(xb, 4 * xa) and torch.equal(yb, 4 * ya)  # ×4 is exact in floating point
    assert xb.abs().max() > 3 and xb.abs().max() <= 4
    assert scaled.held_out_from_prior  # the Bayes reference stays exact (next test)
    train = make_generator(1, 0, 0, 0)
    assert torch.equal(scaled.sample(8, train).inputs, base.sample(8, make_generator(1, 0, 0, 0)).inputs)
    with pytest.raises(ValueError, match="eval_x_scale must be > 0"):
        small(eval_x_scale=0.0)


@pytest.mark.parametrize("scale", [0.5, 3.0])
def test_bayes_stays_exact_on_scaled_inputs(scale):
    """The posterior over W does not involve the law of x, so ridge with λ = σ² stays the
    posterior mean on x ~ U(-α, α): its squared error at every context size j must equal what the
    posterior predicts, σ² + x_qᵀ (XᵀX/σ² + I)⁻¹ x_q (per output), within 5 standard errors of
    the 4000-sequence mean. A predictor built on a wrong posterior (e.g. a prior of W scaled by
    1/α, which keeps W x at its training scale) fails this calibration by far."""
    noise = 0.5
    task = small(n_features=3, n_outputs=2, noise_std=noise, seq_len=16, eval_x_scale=scale)
    batch = task.held_out(4000)
    x, y = decoded(task, batch)
    bayes = task.references()["bayes"].predict(batch)[:, 0::2].double()
    target = batch.targets[:, 0::2].double()
    eye = torch.eye(3, dtype=torch.float64)
    misspecified = []
    for j in (0, 1, 3, 7):
        X = x[:, :j]
        precision = X.mT @ X / noise ** 2 + eye
        predicted = noise ** 2 + torch.einsum("bf,bfg,bg->b", x[:, j], torch.linalg.inv(precision),
                                              x[:, j])
        error = (bayes[:, j] - target[:, j]).pow(2).mean(-1)
        assert within(error - predicted, 0.0), (j, error.mean(), predicted.mean())
        # the posterior mean under the prior W ~ N(0, I/α²): ridge with λ = σ² α²
        wrong = X.mT @ X + noise ** 2 * scale ** 2 * eye
        w = torch.linalg.solve(wrong, X.mT @ y[:, :j])  # (B, f, N)
        misspecified.append((torch.einsum("bf,bfo->bo", x[:, j], w) - target[:, j]).pow(2).mean(-1)
                            - error)
    gap = torch.cat(misspecified)
    assert gap.mean() > Z * gap.std() / math.sqrt(len(gap))


def test_gd_baselines_run_on_the_scaled_data_with_the_training_step_sizes():
    task = small(n_features=3, noise_std=0.3, seq_len=16, eval_x_scale=2.5)
    batch = task.held_out(16)
    x, y = decoded(task, batch)
    assert x.abs().max() > 1.5
    in_distribution = small(n_features=3, noise_std=0.3, seq_len=16)
    for steps in (1, 2):
        assert torch.equal(task.step_sizes(steps), in_distribution.step_sizes(steps))
        prediction = task.references()[f"gd{steps}"].predict(batch)[:, 0::2]
        for j in (1, 4, 7):
            expected = explicit_gd(x, y, j, task.step_sizes(steps)[j].item(), steps)
            assert torch.allclose(prediction[:, j], expected, atol=1e-10), (steps, j)


@pytest.mark.parametrize("prompt", ["interleaved", "tokens"])
def test_n_d_references_are_the_1_d_references_per_output(prompt):
    """Paper 002 A.6 / Table 3: y ∈ R^N with W ∈ R^{N×f} is N independent 1-D problems sharing
    the x's. Every reference's prediction of output o equals the 1-D task's prediction on the
    prompt built from (x, y_o) (and the oracle's from the row W_o), for N = f = 3."""
    f = n_out = 3
    seq_len = 14 if prompt == "interleaved" else 7
    nd = small(n_features=f, n_outputs=n_out, noise_std=0.2, seq_len=seq_len, prompt=prompt,
               gd_steps=[1, 3])
    one = small(n_features=f, n_outputs=1, noise_std=0.2, seq_len=seq_len, prompt=prompt,
                gd_steps=[1, 3])
    # K = 1's step is the same closed form for any N; K > 1 is tuned on a Monte-Carlo sample,
    # which differs between the two tasks: the 1-D task uses the N-D task's steps here
    assert torch.equal(one.step_sizes(1), nd.step_sizes(1))
    one._step_sizes[3] = nd.step_sizes(3)
    batch = nd.sample(32, make_generator(51))
    x, y = nd.examples(batch)
    x, y = x.float(), batch.targets[:, 0::2] if prompt == "interleaved" else batch.targets
    nd_refs, one_refs = nd.references(), one.references()
    for o in range(n_out):
        yo = y[..., o:o + 1]
        if prompt == "interleaved":
            inputs, targets, mask = interleave(x, yo, seq_len)
        else:
            inputs, targets, mask = constructed_tokens(x, yo), yo, batch.loss_mask
        single = dataclasses.replace(batch, inputs=inputs, targets=targets, loss_mask=mask,
                                     latent={"weights": batch.latent["weights"][:, o:o + 1]})
        for name in nd_refs:
            expected = one_refs[name].predict(single)[..., 0]
            got = nd_refs[name].predict(batch)[..., o]
            assert torch.allclose(got, expected, rtol=1e-10, atol=1e-12), (name, o)
    assert {"gd1", "gd3", "bayes", "ols", "oracle"} <= set(nd_refs)


@pytest.mark.parametrize("prompt,score", [("interleaved", "all"), ("tokens", "last")])
def test_zero_baseline_is_the_loss_of_no_in_context_learning(prompt, score):
    """The `zero` reference predicts 0 at every query: its loss is the mean of y² over the
    scored positions (its definition), whose expectation is f/3 + σ² per output coordinate
    (x ~ U(-1, 1)^f, W ~ N(0, I)); with score=last it is the trivial loss of the final query."""
    f, noise = 4, 0.5
    task = LinearRegression(LinearRegression.Config(n_features=f, noise_std=noise, prompt=prompt,
                                                    seq_len=12, n_outputs=2, score=score))
    batch = task.held_out(3000)
    prediction = task.references()["zero"].predict(batch)
    assert prediction.shape == batch.targets.shape and not prediction.any()
    loss = task.position_loss(prediction, batch.targets.double())
    squares = batch.targets.double().pow(2).mean(-1)
    assert torch.equal(loss[batch.loss_mask], squares[batch.loss_mask])
    per_sequence = sequence_means(loss, batch.loss_mask)
    assert within(per_sequence, f / 3 + noise ** 2)

