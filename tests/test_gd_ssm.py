"""GD-SSM core (paper 002): the parallel forward against the step-by-step twin and the layer
written out by hand, carried state = state_size, causality, training steps for both task kinds,
the constructed parameters against one gradient-descent step computed independently, the
comparison measures, and the configuration files. The scan itself: tests/test_scan.py.

Identities run in float64 on parameters redrawn at unit scale; outputs are sums of at most
T·w² products of O(1) numbers (|A| ≤ ~2 over 10 steps keeps them below ~1e5), so rounding stays
below ~1e-10: hence the 1e-8 relative tolerance. The constructed model computes the same sums
as gradient descent in a different order, so it agrees to float64 rounding (1e-12).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml

from conftest import assert_causal, fits_a_fixed_batch, own_fields, redraw_in_float64
from models import IOSpec, build_model, model_families
from models.gd_ssm import GDSSM, GDSSMConfig, query_coordinates
from tasks.base import make_generator
from tasks.linreg import (LinearRegression, comparison_metrics, gd1_step_size,
                          input_sensitivities)

TOL = dict(rtol=1e-8, atol=1e-8)
EXACT = dict(rtol=1e-12, atol=1e-12)
D_MODEL, D_STATE, MAX_LEN, SEQ_LEN = 5, 3, 32, 10
CONF_DIR = Path(__file__).resolve().parents[1] / "conf" / "model"
VARIANTS = [dict(window=3, multiplicative_output=True, mlp=False, n_layers=1),
            dict(window=3, multiplicative_output=True, mlp=True, n_layers=2),
            dict(window=1, multiplicative_output=True, mlp=False, n_layers=1),
            dict(window=3, multiplicative_output=False, mlp=False, n_layers=1),
            dict(window=4, multiplicative_output=False, mlp=True, n_layers=2)]


def make_core(seed: int = 0, **overrides) -> GDSSM:
    config = GDSSMConfig(**{"d_model": D_MODEL, "d_state": D_STATE, **overrides})
    return redraw_in_float64(GDSSM(config, IOSpec("vectors", 3, 3, MAX_LEN)), seed)


def random_inputs(batch: int = 3, seq_len: int = SEQ_LEN, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq_len, D_MODEL, generator=generator, dtype=torch.float64)


def naive_layer(layer, u: torch.Tensor) -> torch.Tensor:
    """Paper 002's layer step by step from the raw parameters: window of the last w inputs
    (zeros before the start), Z_t = A ⊙ Z_{t-1} + Σ_ij Q_ij k_i v_jᵀ, o_t = Z_tᵀ query_t."""
    batch, length, _ = u.shape
    w = layer.window
    z = u.new_zeros(batch, *layer.state_shape)
    outputs = []
    for t in range(length):
        window = [u[:, s] if s >= 0 else torch.zeros_like(u[:, 0]) for s in range(t - w + 1, t + 1)]
        keys = [s @ layer.k_proj.weight.T + layer.k_proj.bias for s in window]
        values = [s @ layer.v_proj.weight.T + layer.v_proj.bias for s in window]
        drive = sum(layer.window_attn[i, j] * keys[i][:, :, None] * values[j][:, None, :]
                    for i in range(w) for j in range(w))
        z = layer.A.view(layer.state_shape) * z + drive
        if hasattr(layer, "window_skip"):
            mixed = sum(layer.window_skip[i] * window[i] for i in range(w))
            query = mixed @ layer.q_proj.weight.T + layer.q_proj.bias
        else:
            query = layer.readout.expand(batch, -1)
        outputs.append((z * query[:, :, None]).sum(1))
    return torch.stack(outputs, 1)


def naive_core(core: GDSSM, x: torch.Tensor) -> torch.Tensor:
    for block in core.blocks:
        y = naive_layer(block.layer, x) @ block.out_proj.weight.T + block.out_proj.bias
        if block.mlp is not None:
            gate = torch.sigmoid(y @ block.mlp.gate.weight.T + block.mlp.gate.bias)
            y = (y * gate) @ block.mlp.proj.weight.T + block.mlp.proj.bias
        x = x + y
    return x


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_parallel_forward_equals_sequential_twin_and_definition(variant):
    core = make_core(**variant)
    x = random_inputs()
    parallel = core(x)
    torch.testing.assert_close(parallel, core.forward_sequential(x)[0], **TOL)
    torch.testing.assert_close(parallel, naive_core(core, x), **TOL)
    forced = GDSSM(dataclasses.replace(core.config, scan="sequential"), core.io).double()
    forced.load_state_dict(core.state_dict())
    torch.testing.assert_close(forced(x), parallel, **TOL)


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_carried_state_continues_the_sequence_and_has_state_size(variant):
    """Run a prefix, keep only the returned states, continue on the suffix: the outputs equal
    the full-sequence ones, and the floats kept per sequence are state_size()."""
    core = make_core(**variant)
    x = random_inputs()
    full = core(x)
    _, states = core.forward_sequential(x[:, :4])
    rest, _ = core.forward_sequential(x[:, 4:], states)
    torch.testing.assert_close(rest, full[:, 4:], **TOL)
    carried = sum(history[0].numel() + z[0].numel() for history, z in states)
    per_layer = (variant["window"] - 1) * D_MODEL + D_STATE * D_STATE
    assert carried == core.state_size(SEQ_LEN) == variant["n_layers"] * per_layer


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_causal(variant):
    assert_causal(make_core(**variant), random_inputs(), t=5)


@pytest.mark.parametrize("kind", ["tokens", "vectors"])
@pytest.mark.parametrize("variant", VARIANTS[:4], ids=str)
def test_training_steps_reduce_the_loss(kind, variant):
    """Forward, backward and AdamW steps through the whole Backbone on a fixed batch: every
    parameter gets a finite gradient, and 30 steps lower the loss."""
    torch.manual_seed(0)
    io = IOSpec(kind, 5, 5, 12)
    model = build_model("gd_ssm", GDSSMConfig(d_model=8, d_state=4, **variant), io)
    fits_a_fixed_batch(model, kind, length=12)


# --- the construction: one gradient-descent step ---------------------------------------------
def regression_data(n_examples: int, n_features: int, n_outputs: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(4, n_examples, n_features, generator=generator, dtype=torch.float64) * 2 - 1
    weights = torch.randn(4, n_outputs, n_features, generator=generator, dtype=torch.float64)
    return x, torch.einsum("bof,bkf->bko", weights, x)


def one_gd_step(x: torch.Tensor, y: torch.Tensor, eta: float) -> torch.Tensor:
    """For every query j: W = 0 - η ∇L(0) with L(W) = 1/(2j) Σ_{k<j} |W x_k - y_k|², i.e.
    W = (η/j) Σ_{k<j} y_k x_kᵀ, then W x_j (0 when j = 0). Written as an explicit loop."""
    predictions = torch.zeros_like(y)
    for j in range(1, x.shape[1]):
        gradient = sum(-torch.einsum("bo,bf->bof", y[:, k], x[:, k]) for k in range(j)) / j
        predictions[:, j] = torch.einsum("bof,bf->bo", -eta * gradient, x[:, j])
    return predictions


def interleaved_prompt(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x-token [x, 0, 1], y-token [0, y, 0] (tasks/linreg.py, paper §3.2 Eqs. 19-20)."""
    batch, n, f = x.shape
    tokens = x.new_zeros(batch, 2 * n, f + y.shape[-1] + 1)
    tokens[:, 0::2, :f], tokens[:, 0::2, -1] = x, 1.0
    tokens[:, 1::2, f:-1] = y
    return tokens


def constructed_tokens(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """[x_{t-1} y_{t-1}, x_t] with an empty first product (paper §3.1 Eq. 14, tasks/linreg.py)."""
    products = torch.cat([torch.zeros_like(x[:, :1]), (x * y)[:, :-1]], dim=1)
    return torch.cat([products, x], dim=-1)


def constructed_model(prompt: str, input_dim: int, n_outputs: int, eta: float, max_len: int):
    config = GDSSMConfig(constructed=True, prompt=prompt, step_size=eta)
    return build_model("gd_ssm", config, IOSpec("vectors", input_dim, n_outputs, max_len)).double()


@pytest.mark.parametrize("n_outputs", [1, 3])
def test_constructed_interleaved_model_is_one_gd_step(n_outputs):
    x, y = regression_data(7, 4, n_outputs)
    prompt = interleaved_prompt(x, y)
    model = constructed_model("interleaved", prompt.shape[-1], n_outputs, 0.7, prompt.shape[1])
    expected = one_gd_step(x, y, 0.7)
    for output in (model(prompt), model.core.forward_sequential(prompt)[0]):
        torch.testing.assert_close(output[:, 0::2], expected, **EXACT)


def test_constructed_token_model_is_one_gd_step():
    x, y = regression_data(9, 5, 1)
    tokens = constructed_tokens(x, y)
    model = constructed_model("tokens", tokens.shape[-1], 1, 1.3, tokens.shape[1])
    expected = one_gd_step(x, y, 1.3)
    torch.testing.assert_close(model(tokens), expected, **EXACT)
    torch.testing.assert_close(model.core.forward_sequential(tokens)[0], expected, **EXACT)
    # Its state is the gradient accumulator (f floats) plus the two previous tokens.
    assert model.state_size(9) == 5 + 2 * tokens.shape[-1]


@pytest.mark.parametrize("prompt,n_outputs", [("tokens", 1), ("interleaved", 1),
                                              ("interleaved", 2)])
def test_constructed_model_matches_the_tasks_gd1_reference(prompt, n_outputs):
    """On the task's own prompts, with η set to the task's MSE-optimal step for j examples, the
    constructed model's prediction for the query after j examples is the `gd1` reference's.

    Interleaved prompts hold x and y themselves: agreement to float64 rounding. Constructed
    tokens hold the float32-rounded products x_k y_k, which the model sums as they are, while the
    reference recovers y_k from them and recomputes the products in float64: each term then
    differs by at most a few float32 ulps, so the tolerance is η/j Σ_k |x_k y_k|ᵀ|x_j| · 2⁻²¹."""
    task = LinearRegression(LinearRegression.Config(seq_len=16, n_features=3,
                                                    n_outputs=n_outputs, prompt=prompt))
    batch = task.sample(6, make_generator(1, 5))
    inputs = batch.inputs.double()
    reference = task.references()["gd1"].predict(batch)
    for j in (1, 4, 7):
        eta = float(gd1_step_size(torch.tensor([j]), 3, 0.0))
        model = constructed_model(prompt, task.input_dim, n_outputs, eta, task.seq_len)
        position = 2 * j if prompt == "interleaved" else j
        error = (model(inputs)[:, position] - reference[:, position]).abs()
        if prompt == "interleaved":
            assert error.max() < 1e-12
        else:
            products, query = inputs[:, 1:j + 1, :3].abs(), inputs[:, j, 3:].abs()
            bound = eta / j * (products @ query.unsqueeze(-1)).sum((1, 2)) * 2.0 ** -21
            assert (error.squeeze(-1) <= bound).all()


def test_constructed_model_rejects_the_other_prompt():
    x, y = regression_data(6, 4, 1)
    tokens = constructed_tokens(x, y)  # input_dim 8 = 4 + 2 + ... is also an interleaved size
    model = constructed_model("interleaved", tokens.shape[-1], 1, 1.0, tokens.shape[1])
    with pytest.raises(ValueError, match="prompt"):
        model(tokens)
    prompt = interleaved_prompt(regression_data(3, 6, 1)[0], regression_data(3, 6, 1)[1])
    model = constructed_model("tokens", prompt.shape[-1], 1, 1.0, prompt.shape[1])
    with pytest.raises(ValueError, match="prompt"):
        model(prompt)


def test_constructed_parameters_keep_training():
    """The construction is a starting point too (paper App. A.8): gradients reach it."""
    x, y = regression_data(6, 4, 1)
    tokens = constructed_tokens(x, y)
    model = constructed_model("tokens", tokens.shape[-1], 1, 1.0, tokens.shape[1])
    (model(tokens) - y).pow(2).mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    assert model.core.layer.A.grad.abs().sum() > 0


def test_feature_map_under_the_frozen_construction_is_one_gd_step_on_its_features():
    """App. A.8's comparator (features > 0): ŷ_j = (η/j) Σ_{k<j} y_k φ(x_k)ᵀ φ(x_j) with φ the
    trained embedding and gated unit, computed here from φ directly; only φ trains, the
    constructed layer stays frozen, and the sequential twin agrees."""
    x, y = regression_data(7, 1, 1)
    prompt = interleaved_prompt(x, y)
    config = GDSSMConfig(constructed=True, prompt="interleaved", step_size=0.6, features=5)
    model = build_model("gd_ssm", config,
                        IOSpec("vectors", prompt.shape[-1], 1, prompt.shape[1])).double()
    phi = model.core.feature_map(x)
    assert phi.shape == (4, 7, 5)
    expected = one_gd_step(phi, y, 0.6)
    for output in (model(prompt), model.core.forward_sequential(prompt)[0]):
        torch.testing.assert_close(output[:, 0::2], expected, **EXACT)
    (model(prompt)[:, 0::2] - y).pow(2).mean().backward()
    assert all(p.grad is None for p in model.core.layer.parameters())
    assert all(p.grad.abs().sum() > 0 for p in model.core.feature_map.parameters())
    assert not any(p.requires_grad for p in model.core.layer.parameters())


def test_config_validation():
    for bad in (dict(features=4), dict(constructed=True, prompt="tokens", features=4),
                dict(constructed=True, prompt="interleaved", features=-1)):
        with pytest.raises(ValueError, match="features"):
            GDSSMConfig(**bad)
    with pytest.raises(ValueError, match="constructed"):
        GDSSMConfig(constructed=True, n_layers=2)
    with pytest.raises(ValueError, match="constructed"):
        GDSSMConfig(constructed=True, multiplicative_output=False)
    with pytest.raises(ValueError, match="constructed"):
        GDSSMConfig(constructed=True, prompt="interleaved", window=2)
    with pytest.raises(ValueError, match="prompt"):
        GDSSMConfig(prompt="pairs")
    with pytest.raises(ValueError, match="1-D"):
        build_model("gd_ssm", GDSSMConfig(constructed=True, prompt="tokens"),
                    IOSpec("vectors", 12, 2, 8))


# --- comparison measures (paper Fig. 1-2) ----------------------------------------------------
def test_sensitivities_of_the_construction_are_the_gd_weights():
    """∂ŷ_j/∂x_j of one GD step is W_j = (η/j) Σ_{k<j} y_k x_kᵀ; autograd must return it."""
    x, y = regression_data(6, 3, 2)
    prompt = interleaved_prompt(x, y)
    model = constructed_model("interleaved", prompt.shape[-1], 2, 0.9, prompt.shape[1])
    mask = torch.zeros(prompt.shape[:2], dtype=torch.bool)
    mask[:, 0::2] = True
    jacobian = input_sensitivities(model, prompt, query_coordinates("interleaved", 6, 2), mask)
    for j in range(6):
        weights = (0.9 / j * sum(torch.einsum("bo,bf->bof", y[:, k], x[:, k]) for k in range(j))
                   if j else torch.zeros(4, 2, 3, dtype=torch.float64))
        torch.testing.assert_close(jacobian[:, 2 * j], weights, **EXACT)
    assert jacobian[:, 1::2].abs().max() == 0  # unscored positions


def test_comparison_metrics_against_their_definitions():
    """A predictor against twice itself: cosine 1, sensitivity distance |J|, prediction
    distance |ŷ|; against itself everything vanishes. Position 0 (GD has no example, zero
    sensitivity) is left out of the cosine, where it is undefined."""
    x, y = regression_data(8, 4, 1)
    tokens = constructed_tokens(x, y)
    model = constructed_model("tokens", tokens.shape[-1], 1, 1.0, tokens.shape[1])
    mask = torch.ones(tokens.shape[:2], dtype=torch.bool)
    query = query_coordinates("tokens", tokens.shape[-1], 1)
    same = comparison_metrics(model, model, tokens, y, mask, query)
    assert same["prediction_l2"] == 0 and same["sensitivity_l2"] == 0
    nothing = comparison_metrics(model, lambda s: 0 * model(s), tokens, y, mask, query)
    assert nothing["sensitivity_cosine"] is None  # no position where both are non-zero
    assert nothing["prediction_l2_relative"] is None  # the reference's norm is 0
    assert same["sensitivity_cosine"] == pytest.approx(1.0, abs=1e-12)
    assert same["loss"] == same["reference_loss"]
    double = comparison_metrics(model, lambda s: 2 * model(s), tokens, y, mask, query)
    prediction = model(tokens)
    jacobian = input_sensitivities(model, tokens, query, mask)
    assert double["sensitivity_cosine"] == pytest.approx(1.0, abs=1e-12)
    assert double["prediction_l2"] == pytest.approx(prediction.norm(dim=-1).mean().item(),
                                                    rel=1e-12)
    assert double["sensitivity_l2"] == pytest.approx(jacobian.flatten(-2).norm(dim=-1)
                                                     .mean().item(), rel=1e-12)
    assert double["reference_loss"] == pytest.approx(
        (2 * prediction - y).pow(2).mean().item(), rel=1e-12)
    # distances relative to the reference's norms: |ŷ - 2ŷ| / |2ŷ| = 1/2
    assert double["prediction_l2_relative"] == pytest.approx(0.5, rel=1e-12)
    assert double["sensitivity_l2_relative"] == pytest.approx(0.5, rel=1e-12)
    in_threes = comparison_metrics(model, lambda s: 2 * model(s), tokens, y, mask, query, 3)
    # every sequence at half the reference's norm: the ratio's bootstrap interval is a point
    assert double["prediction_l2_relative_ci"] == pytest.approx([0.5, 0.5], rel=1e-12)
    assert double["sensitivity_cosine_ci"] == pytest.approx([1.0, 1.0], abs=1e-12)
    for key, value in double.items():  # batches of 3 sequences: 3 + 3 + 2
        assert in_threes[key] == pytest.approx(value, rel=1e-12)


@pytest.mark.parametrize("prompt", ["interleaved", "tokens"])
def test_gd1_on_prompts_is_the_gd1_reference(prompt):
    """The differentiable one-step predictor the comparison uses is the gd1 reference."""
    task = LinearRegression(LinearRegression.Config(
        seq_len=12 if prompt == "interleaved" else 6, n_features=3, n_outputs=2, prompt=prompt))
    batch = task.held_out(16)
    torch.testing.assert_close(task.gd1_on_prompts(batch.inputs),
                               task.references()["gd1"].predict(batch), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("prompt", ["interleaved", "tokens"])
def test_gd_comparison_of_the_construction_and_of_twice_it(prompt):
    """metrics.probe.gd_comparison (paper 002 Fig. 1B/2B), scored at the final query: the
    constructed GD-SSM with gd1's step there is one GD step (distance 0, cosine 1); with twice
    the step its predictions and sensitivities are twice GD's (relative distances 1, cosine 1).
    Tokens agree to float32 rounding only: the model reads the stored products y_k x_k, GD the
    y_k recovered from them (LinearRegression.examples)."""
    tol = 1e-9 if prompt == "interleaved" else 1e-6
    task = LinearRegression(LinearRegression.Config(
        seq_len=9 if prompt == "interleaved" else 5, n_features=3, prompt=prompt, score="last"))
    io = IOSpec("vectors", task.input_dim, task.output_dim, task.seq_len)
    eta = float(task.step_sizes(1)[task.n_examples - 1])
    for scale in (1, 2):
        config = GDSSMConfig(constructed=True, prompt=prompt, step_size=scale * eta)
        model = build_model("gd_ssm", config, io)
        found = task.summarize_predictor(float64_predictor(model), 100)["gd_comparison"]
        assert found["prompts"] == 512
        assert found["sensitivity_cosine"] == pytest.approx(1.0, abs=tol)
        assert found["prediction_l2_relative"] == pytest.approx(scale - 1, abs=tol)
        assert found["sensitivity_l2_relative"] == pytest.approx(scale - 1, abs=tol)
        if scale == 1:
            assert found["loss"] == pytest.approx(found["reference_loss"], rel=tol)


@pytest.mark.parametrize("name,constructed", [("gd_ssm", False), ("gd_ssm_constructed", True)])
def test_config_files_list_every_field(name, constructed):
    text = (CONF_DIR / f"{name}.yaml").read_text()
    assert text.startswith("# ")
    values = yaml.safe_load(text)
    assert values.pop("family") == "gd_ssm"
    assert set(values) == own_fields(GDSSMConfig)
    assert values["constructed"] is constructed
    assert model_families()["gd_ssm"] is GDSSM
    GDSSMConfig(**values)


# --- the learned update read off the predictor (paper 002 Fig. 3: tasks/linreg.py gd_match) ----
def gd_task(n_outputs: int = 1, features: int = 3, seq_len: int = 9) -> LinearRegression:
    return LinearRegression(LinearRegression.Config(seq_len=seq_len, n_features=features,
                                                    n_outputs=n_outputs, score="last"))


def float64_predictor(model):
    model = model.double().eval()
    return lambda inputs: model.predict(inputs.double())


def test_gd_coefficients_are_the_cubic_coefficients_by_definition():
    """A hand-written predictor ŷ_a = Σ_k w_k Σ T[a,b,c,d] y_kb x_kc x_qd plus every other kind
    of monomial of degree ≤ 3 (constant, linear, squares, x_k x_k x_q, y_k y_k x_q, pairs of
    different examples): the mixed difference returns w_k T exactly, at any step."""
    task = gd_task(n_outputs=2, features=3, seq_len=9)  # 5 examples, 4 before the query
    f, n, q = 3, 2, 4
    gen = torch.Generator().manual_seed(0)
    T = torch.randn(n, n, f, f, generator=gen, dtype=torch.float64)
    w = torch.randn(q, generator=gen, dtype=torch.float64)
    other = torch.randn(6, n, generator=gen, dtype=torch.float64)

    def predict(inputs):
        x = inputs[:, 0::2, :f].double()  # (B, q + 1, f)
        y = inputs[:, 1::2, f:f + n].double()  # (B, q, n)
        xq, xs = x[:, q], x[:, :q]
        main = torch.einsum("k,abcd,zkb,zkc,zd->za", w, T, y, xs, xq)
        extra = (other[0] + other[1] * xq.sum(-1, keepdim=True)
                 + other[2] * xs.pow(2).sum((1, 2))[:, None]
                 + other[3] * (xs.pow(2).sum(-1) * xq[:, None, 0]).sum(1)[:, None]
                 + other[4] * (y.pow(2).sum(-1) * xq[:, None, 1]).sum(1)[:, None]
                 + other[5] * (y[:, 0, :1] * xs[:, 1, :1] * xq[:, :1]))
        out = torch.zeros(inputs.shape[0], inputs.shape[1], n, dtype=torch.float64)
        out[:, 2 * q] = main + extra
        return out

    expected = w[:, None, None, None, None] * T  # y_0 x_1 x_q pairs no example with itself
    for step in (1.0, 0.25):  # steps exact in the float32 prompts
        coefficients = task.gd_coefficients(predict, batch_size=37, step=step)
        assert coefficients.shape == (q, n, n, f, f)
        torch.testing.assert_close(coefficients, expected, rtol=1e-12, atol=1e-12)


def test_constructed_gd_ssm_is_one_gd_step():
    """gd_ssm constructed=true is one GD step from W = 0 with step η: cosine 1, every example
    weighted by η, a cubic predictor; 1-D and N-D targets."""
    for n_outputs in (1, 3):
        task = gd_task(n_outputs=n_outputs)
        io = IOSpec("vectors", task.input_dim, task.output_dim, task.seq_len)
        model = build_model("gd_ssm", GDSSMConfig(constructed=True, step_size=0.7), io)
        match = task.summarize_predictor(float64_predictor(model), 64)["gd_match"]
        assert match["cosine"] == pytest.approx(1.0, abs=1e-12)
        assert match["cosine_by_example"] == pytest.approx([1.0] * 4, abs=1e-12)
        assert match["step_by_example"] == pytest.approx([0.7] * 4, rel=1e-12)
        assert match["step"] == pytest.approx(0.7, rel=1e-12)
        assert match["step_spread"] == pytest.approx(1.0, rel=1e-12)
        assert match["gd1_step"] == pytest.approx(float(gd1_step_size(torch.tensor(4), 3, 0.0)))
        assert match["cubic"] is True


def test_gd_match_sees_the_recurrence():
    """Decay A = a instead of 1: the pair (x_k, y_k) enters the state at x_{k+1}'s position,
    2(q - k - 1) steps before the query, so example k's step is η a^(2(q-k-1)) (Fig. 3B)."""
    task = gd_task()
    io = IOSpec("vectors", task.input_dim, task.output_dim, task.seq_len)
    model = build_model("gd_ssm", GDSSMConfig(constructed=True), io).double()
    with torch.no_grad():
        model.core.layer.A.fill_(0.8)
    match = task.summarize_predictor(float64_predictor(model), 64)["gd_match"]
    expected = [0.8 ** (2 * (4 - k - 1)) for k in range(4)]
    assert match["step_by_example"] == pytest.approx(expected, rel=1e-12)
    assert match["step_spread"] == pytest.approx(0.8 ** 6, rel=1e-12)
    assert match["cosine_by_example"] == pytest.approx([1.0] * 4, abs=1e-12)
    assert match["cosine"] < 0.95  # the uneven weights are not one GD step


def test_gd_match_is_blind_to_the_symmetries():
    """The same function in other parameters: rescalings traded between key, value and query
    maps, a basis change of the state (with A = 1), and the pairing (x_j, y_j) read at the y_j
    position instead of (x_{j-1}, y_{j-1}) at x_j. A measure on the raw parameters would see
    three different models; gd_match sees the construction each time."""
    task = gd_task(n_outputs=2)
    io = IOSpec("vectors", task.input_dim, task.output_dim, task.seq_len)
    gen = torch.Generator().manual_seed(1)
    basis = torch.randn(3, 3, generator=gen, dtype=torch.float64) + 3 * torch.eye(3)
    for change in ("scale", "basis", "pairing"):
        model = build_model("gd_ssm", GDSSMConfig(constructed=True), io).double()
        layer = model.core.layer
        with torch.no_grad():
            if change == "scale":
                layer.k_proj.weight.mul_(4.0)
                layer.v_proj.weight.mul_(0.5)
                layer.q_proj.weight.mul_(0.5)
            elif change == "basis":
                layer.k_proj.weight.copy_(basis @ layer.k_proj.weight)
                layer.q_proj.weight.copy_(torch.linalg.inv(basis).T @ layer.q_proj.weight)
            else:
                layer.window_attn.zero_()
                layer.window_attn[1, 2] = 1.0
        match = task.summarize_predictor(float64_predictor(model), 64)["gd_match"]
        assert match["cosine"] == pytest.approx(1.0, abs=1e-12), change
        assert match["step_by_example"] == pytest.approx([1.0] * 4, rel=1e-12), change


def test_gd_match_of_trained_style_models():
    """A random one-layer GD-SSM is cubic in its inputs (and not one GD step); two layers, or
    a Mamba, are not cubic, which the half-step check reports; constructed tokens get none."""
    task = gd_task()
    io = IOSpec("vectors", task.input_dim, task.output_dim, task.seq_len)
    torch.manual_seed(0)
    one = task.summarize_predictor(float64_predictor(
        build_model("gd_ssm", GDSSMConfig(d_model=8, d_state=4), io)), 64)["gd_match"]
    assert one["cubic"] is True and abs(one["cosine"]) < 0.9
    two = task.summarize_predictor(float64_predictor(
        build_model("gd_ssm", GDSSMConfig(d_model=8, d_state=4, n_layers=2), io)), 64)
    assert two["gd_match"]["cubic"] is False
    mamba = model_families()["mamba"]
    assert task.summarize_predictor(float64_predictor(
        build_model("mamba", mamba.Config(d_model=16), io)), 64)["gd_match"]["cubic"] is False
    tokens = LinearRegression(LinearRegression.Config(seq_len=5, n_features=3, prompt="tokens"))
    assert set(tokens.summarize_predictor(lambda x: x[..., -1:], 64)) == {"gd_comparison"}
    # too large to read (16 j N f² prompts of 2j + 1 tokens: 16·20·20·400·41 = 1.05e8 tokens)
    large = gd_task(n_outputs=20, features=20, seq_len=42)
    assert set(large.summarize_predictor(lambda x: x[..., :20], 64)) == {"gd_comparison"}
    # every query scored: 21 positions × 20 outputs = 420 backward passes > 400
    every = LinearRegression(LinearRegression.Config(seq_len=42, n_features=20, n_outputs=20))
    assert every.summarize_predictor(lambda x: 1 / 0, 64) == {}
