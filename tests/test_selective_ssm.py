"""Selective SSM core (paper 004): parallel forward against its sequential twin and against the
recurrence written out by hand, carried state = state_size, causality, (non-)selectivity, the
configuration files, a training step for both task kinds, and Lemma 4.1's construction: the
steady-state Kalman predictor of a known LG-SSM, against the task's Kalman filter. The scans
themselves: tests/test_scan.py.

Identities run in float64 on parameters redrawn at unit scale (so decays of both signs and above
1 in magnitude occur and every path matters). With |Ā| ≤ ~2 over 12 steps the states stay below
~1e4, so float64 rounding is below ~1e-11: hence the 1e-9 tolerance.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml

from conftest import assert_causal, fits_a_fixed_batch, own_fields, redraw_in_float64
from models import IOSpec, build_model, model_families
from models.selective_ssm import (SelectiveSSM, SelectiveSSMConfig, construct_kalman_predictor,
                                  steady_state_kalman)
from tasks.base import make_generator
from tasks.lgssm import LGSSMConfig, LGSSMTask, kalman_filter, stationary_covariance

TOL = dict(rtol=1e-9, atol=1e-9)
D_MODEL, MAX_LEN, SEQ_LEN = 6, 32, 12
CONF_DIR = Path(__file__).resolve().parents[1] / "conf" / "model"
VARIANTS = [dict(selective=s, transition=t, n_layers=n)
            for s in (True, False) for t in ("linear", "exp") for n in (1, 2)]


def make_core(seed: int = 0, **overrides) -> SelectiveSSM:
    config = SelectiveSSMConfig(**{"d_model": D_MODEL, **overrides})
    return redraw_in_float64(SelectiveSSM(config, IOSpec("vectors", 3, 3, MAX_LEN)), seed)


def random_inputs(batch: int = 3, seq_len: int = SEQ_LEN, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq_len, D_MODEL, generator=generator, dtype=torch.float64)


def naive_layer(layer, x: torch.Tensor) -> torch.Tensor:
    """Paper 004 App. B.1 written out per time step from the raw parameters."""
    h = x.new_zeros(x.shape[0], x.shape[2])
    out = []
    for t in range(x.shape[1]):
        if layer.selective:
            s = torch.nn.functional.silu(x[:, t] @ layer.in_proj.weight.T + layer.in_proj.bias)
            a = s @ layer.a_proj.weight.T + layer.a_proj.bias
            b = s @ layer.b_proj.weight.T + layer.b_proj.bias
        else:
            a, b = layer.a_bar.expand(x.shape[0], -1), layer.b_bar
        if layer.transition == "exp":
            a = torch.exp(-torch.log1p(torch.exp(a)))
        h = a * h + b * x[:, t]
        out.append(h)
    return torch.stack(out, 1)


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_parallel_forward_equals_sequential_twin_and_definition(variant):
    core = make_core(**variant)
    x = random_inputs()
    parallel = core(x)
    sequential, _ = core.forward_sequential(x)
    torch.testing.assert_close(parallel, sequential, **TOL)
    expected = x
    for layer in core.layers:
        expected = naive_layer(layer, expected)
    torch.testing.assert_close(parallel, expected, **TOL)
    forced = SelectiveSSM(dataclasses.replace(core.config, scan="sequential"), core.io).double()
    forced.load_state_dict(core.state_dict())
    torch.testing.assert_close(forced(x), parallel, **TOL)


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_carried_state_continues_the_sequence_and_has_state_size(variant):
    """Run a prefix, keep only the returned states, continue on the suffix: the outputs equal
    the full-sequence ones, and the floats kept per sequence are state_size()."""
    core = make_core(**variant)
    x = random_inputs()
    full = core(x)
    split = 5
    _, states = core.forward_sequential(x[:, :split])
    rest, _ = core.forward_sequential(x[:, split:], states)
    torch.testing.assert_close(rest, full[:, split:], **TOL)
    carried = sum(state[0].numel() for state in states)
    assert carried == core.state_size(SEQ_LEN) == variant["n_layers"] * D_MODEL


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_causal(variant):
    assert_causal(make_core(**variant), random_inputs(), t=6)


def test_nonselective_transition_ignores_the_input_and_selective_does_not():
    x, other = random_inputs(seed=1), random_inputs(seed=2)
    fixed = make_core(selective=False).layers[0]
    a1, b1 = fixed.coefficients(x)
    a2, b2 = fixed.coefficients(other)
    assert torch.equal(a1, a2)
    torch.testing.assert_close(b1 / x, b2 / other, **TOL)  # B̄ is a constant vector
    selective = make_core(selective=True).layers[0]
    assert (selective.coefficients(x)[0] - selective.coefficients(other)[0]).abs().max() > 1e-3


def test_initialisation_is_stable():
    """At initialisation (no redraw) the decays lie in [0.5, 1 - 1/max_len] up to the small
    selective perturbation, and the non-selective layer is an exact moving average
    (B̄ = 1 - Ā): a constant unit input gives states 1 - Ā^(t+1) ∈ (0, 1)."""
    x = torch.ones(2, 200, D_MODEL)
    for transition in ("linear", "exp"):
        for selective in (True, False):
            torch.manual_seed(0)
            core = SelectiveSSM(SelectiveSSMConfig(d_model=D_MODEL, selective=selective,
                                                   transition=transition),
                                IOSpec("vectors", 3, 3, MAX_LEN))
            a, _ = core.layers[0].coefficients(torch.randn(2, 200, D_MODEL))
            assert a.min() > 0.4 and a.max() < 1.0
            if not selective:
                states = core(x)
                assert states.min() > 0.0 and states.max() <= 1.0


def test_config_validation():
    with pytest.raises(ValueError, match="transition"):
        SelectiveSSMConfig(transition="tanh")
    with pytest.raises(ValueError, match="scan"):
        SelectiveSSMConfig(scan="fast")


@pytest.mark.parametrize("name,selective", [("selective_ssm", True),
                                            ("nonselective_ssm", False)])
def test_config_files_list_every_field(name, selective):
    text = (CONF_DIR / f"{name}.yaml").read_text()
    assert text.startswith("# ")
    values = yaml.safe_load(text)
    assert values.pop("family") == "selective_ssm"
    assert set(values) == own_fields(SelectiveSSMConfig)
    assert values["selective"] is selective
    assert model_families()["selective_ssm"] is SelectiveSSM
    SelectiveSSMConfig(**values)


@pytest.mark.parametrize("kind", ["tokens", "vectors"])
@pytest.mark.parametrize("selective", [True, False])
def test_training_steps_reduce_the_loss(kind, selective):
    """Forward, backward and AdamW steps through the whole Backbone on a fixed batch: gradients
    reach every parameter, are finite, and 30 steps lower the loss."""
    torch.manual_seed(0)
    io = IOSpec(kind, 5, 5, 16)
    model = build_model("selective_ssm", SelectiveSSMConfig(d_model=8, selective=selective), io)
    fits_a_fixed_batch(model, kind, length=16)


# --- paper 004 Lemma 4.1: the Kalman filter of a known θ ------------------------------------
EXACT = dict(rtol=0, atol=1e-11)  # float64; predictions are O(1), 128 steps of a stable filter
LGSSM = LGSSMTask(LGSSMConfig(seq_len=128))


def real_pole_systems(count: int) -> list[dict[str, torch.Tensor]]:
    """The first `count` systems of a fixed draw from the task's prior whose steady-state
    predictor A - K C has real eigenvalues (about 97% of the prior; the others are refused)."""
    latent = LGSSM.draw_latent(4 * count, make_generator(0, 7))
    systems = []
    for i in range(4 * count):
        theta = {k: v[i] for k, v in latent.items()}
        _, gain = steady_state_kalman(**theta)
        if torch.linalg.eigvals(theta["A"] - gain @ theta["C"]).imag.abs().max() == 0:
            systems.append(theta)
    return systems[:count]


def kalman_model(theta, d_model: int = 4, **config):
    model = build_model("selective_ssm", SelectiveSSMConfig(d_model=d_model, **config),
                        IOSpec("vectors", 2, 2, LGSSM.seq_len)).double()
    construct_kalman_predictor(model, **theta)
    return model


def sequences_of(theta, n: int = 16, seed: int = 0):
    """n sequences of the system θ, started from its stationary law as the task does."""
    latent = {k: v.expand(n, *v.shape) for k, v in theta.items()}
    return LGSSM.sample_given(latent, make_generator(1, seed))


def steady_state_filter(theta, inputs):
    """The task's Kalman filter started at the steady-state covariance: constant gains."""
    P, _ = steady_state_kalman(**theta)
    batched = {k: v.unsqueeze(0) for k, v in theta.items()}
    return kalman_filter(inputs, batched["A"], batched["C"], batched["Q"], batched["R"],
                         P).next_mean


@pytest.mark.parametrize("config", [dict(), dict(selective=False), dict(transition="exp"),
                                    dict(d_model=16)], ids=str)
def test_kalman_construction_is_the_steady_state_kalman_predictor(config):
    """Lemma 4.1 for a known θ: the constructed model's prediction after x_1..x_t is E[x_{t+1} |
    x_1..x_t, θ] computed by the task's own Kalman filter (tasks/lgssm.py) started at the
    steady-state covariance, to float64 rounding, for four systems of the prior; selective or
    not (the time-invariant filter needs no selectivity), either transition, the paper's n = 16."""
    for i, theta in enumerate(real_pole_systems(4)):
        model = kalman_model(theta, **config)
        inputs = sequences_of(theta, seed=i).inputs.double()
        with torch.no_grad():
            torch.testing.assert_close(model(inputs), steady_state_filter(theta, inputs), **EXACT)


def test_kalman_construction_from_the_stationary_start_has_a_vanishing_transient():
    """The task's clairvoyant filter starts at the stationary covariance, so its gains K_t vary
    before they settle at K: the time-invariant model differs at first (by a sizeable fraction
    of the O(1) prediction) and the difference dies out geometrically along the sequence."""
    for i, theta in enumerate(real_pole_systems(4)):
        batch = sequences_of(theta, seed=i)
        with torch.no_grad():
            error = (kalman_model(theta)(batch.inputs.double())
                     - LGSSM.clairvoyant(batch)).abs().amax((0, 2))
        assert error[0] > 1e-2
        assert error[-16:].max() < 1e-3 * error[0]


def test_steady_state_is_the_riccati_fixed_point():
    theta = real_pole_systems(1)[0]
    A, C, Q, R = theta["A"], theta["C"], theta["Q"], theta["R"]
    P, K = steady_state_kalman(**theta)
    S = C @ P @ C.T + R
    torch.testing.assert_close(A @ (P - P @ C.T @ torch.linalg.solve(S, C @ P)) @ A.T + Q, P,
                               rtol=0, atol=1e-12)
    torch.testing.assert_close(K, A @ P @ C.T @ torch.linalg.inv(S), rtol=0, atol=1e-12)


PERTURBATIONS = {  # one entry of one constructed parameter each, moved by 0.01
    "decay": lambda m: m.core.layers[0].a_proj.bias[0],
    "input_gain": lambda m: m.core.layers[0].b_proj.bias[1],
    "selective_weight": lambda m: m.core.layers[0].a_proj.weight[2, 0],
    "encoder": lambda m: m.encoder.weight[0, 1],
    "decoder": lambda m: m.decoder.weight[1, 3],
}


@pytest.mark.parametrize("name", PERTURBATIONS)
def test_a_perturbed_kalman_construction_is_not_the_filter(name):
    """Negative control: moving any one constructed entry by 0.01 moves the predictions by more
    than 1e-4, so the comparison above can fail. (The selective weight W_A is zero in the
    construction: once non-zero, Ā_t depends on x_t through s_t = SiLU(U x_t + b) with U = 0,
    b = 0, i.e. s_t = 0, so it is moved together with U.)"""
    theta = real_pole_systems(1)[0]
    model = kalman_model(theta)
    with torch.no_grad():
        PERTURBATIONS[name](model).add_(0.01)
        if name == "selective_weight":
            model.core.layers[0].in_proj.weight.fill_(1.0)
        inputs = sequences_of(theta).inputs.double()
        assert (model(inputs) - steady_state_filter(theta, inputs)).abs().max() > 1e-4


def test_kalman_construction_refuses_what_a_real_diagonal_state_cannot_hold():
    theta = real_pole_systems(1)[0]
    with pytest.raises(ValueError, match="one-layer"):
        kalman_model(theta, n_layers=2)
    with pytest.raises(ValueError, match="d_model >= 4"):
        kalman_model(theta, d_model=3)
    # A rotation seen through one coordinate: the steady-state predictor oscillates.
    angle = torch.tensor(0.6, dtype=torch.float64)
    rotation = 0.9 * torch.stack([torch.stack([angle.cos(), -angle.sin()]),
                                  torch.stack([angle.sin(), angle.cos()])])
    oscillating = dict(A=rotation, C=torch.tensor([[1.0, 0.0]], dtype=torch.float64),
                       Q=0.1 * torch.eye(2, dtype=torch.float64),
                       R=torch.tensor([[0.1]], dtype=torch.float64))
    model = build_model("selective_ssm", SelectiveSSMConfig(d_model=2), IOSpec("vectors", 1, 1, 8))
    with pytest.raises(ValueError, match="complex eigenvalues"):
        construct_kalman_predictor(model.double(), **oscillating)


def test_lemma_4_1_recursion_is_the_predictor_not_the_filtered_estimate():
    """Lemma 4.1 writes ẑ_{t|t} = (A - K_t C) ẑ_{t-1|t-1} + K_t x_t. With the predictor gain
    A P_t Cᵀ S_t⁻¹ (P_t from the Riccati recursion, time-varying from the stationary start) that
    recursion is the one-step predictor ẑ_{t+1|t}: C times it is the task's Kalman prediction.
    With the filter gain K_t = P_t Cᵀ S_t⁻¹ it is not the filtered estimate ẑ_{t|t}, whose
    recursion is (I - K_t C) A ẑ_{t-1|t-1} + K_t x_t (C A times that is the prediction again)."""
    theta = real_pole_systems(1)[0]
    A, C, Q, R = theta["A"], theta["C"], theta["Q"], theta["R"]
    batch = sequences_of(theta, n=4)
    inputs = batch.inputs.double()
    predictor, lemma, filtered = (inputs.new_zeros(4, 4) for _ in range(3))
    P = stationary_covariance(A, Q)
    from_predictor, from_filtered, from_lemma, lemma_gap = [], [], [], []
    for t in range(inputs.shape[1]):
        x = inputs[:, t]
        filter_gain = P @ C.T @ torch.linalg.inv(C @ P @ C.T + R)
        predictor_gain = A @ filter_gain
        predictor = predictor @ (A - predictor_gain @ C).T + x @ predictor_gain.T
        lemma = lemma @ (A - filter_gain @ C).T + x @ filter_gain.T
        filtered = filtered @ ((torch.eye(4, dtype=A.dtype) - filter_gain @ C) @ A).T \
            + x @ filter_gain.T
        from_predictor.append(predictor @ C.T)
        from_filtered.append(filtered @ (C @ A).T)
        from_lemma.append(lemma @ (C @ A).T)
        lemma_gap.append(float((lemma - filtered).abs().max()))
        P = A @ (P - filter_gain @ C @ P) @ A.T + Q
    clairvoyant = LGSSM.clairvoyant(batch)
    torch.testing.assert_close(torch.stack(from_predictor, 1), clairvoyant, **EXACT)
    torch.testing.assert_close(torch.stack(from_filtered, 1), clairvoyant, **EXACT)
    assert max(lemma_gap) > 1e-2
    # the task's references (tasks/lgssm.py, batched over sequences) are these two recursions
    torch.testing.assert_close(LGSSM.lemma41(batch), clairvoyant, **EXACT)
    torch.testing.assert_close(LGSSM.lemma41(batch, as_written=True),
                               torch.stack(from_lemma, 1), **EXACT)
