"""The recurrent baselines: LSTM (models/lstm.py), LRU (models/lru.py), Griffin (models/griffin.py).

For each core: the parallel forward equals its step-by-step twin in float64; the output at t
does not depend on inputs after t; `state_size` equals the number of floats in the state the
step-by-step twin actually carries; and a full model from `models.build_model` trains (forward,
backward, one optimiser step) for token and vector tasks. The initialisations are checked against
their definitions; the scans themselves in tests/test_scan.py."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from models import IOSpec, build_model, model_families
from models.griffin import DECAY_INIT, GATE_EXPONENT, rnn_width

FAMILIES = ("lstm", "lru", "griffin")
EPS = torch.finfo(torch.float64).eps
LENGTH = 37  # not a power of two, so the doubling scans meet a ragged last step
BATCH = 2


def small_config(family: str):
    config = model_families()[family].Config()
    if family == "griffin":
        # A window shorter than LENGTH, so the band mask and the cache trimming are exercised.
        config = replace(config, window=5)
    return config


def make_core(family: str, seed: int = 0):
    torch.manual_seed(seed)
    io = IOSpec("vectors", 3, 2, 64)
    return model_families()[family](small_config(family), io).double().eval()


def rounding_tolerance(core, scale: float) -> float:
    """Worst-case rounding bound of a float64 sum of n terms is n·eps·(sum of |terms|). The
    longest sums here run over time (LENGTH) or over the widest contraction (the Griffin MLP,
    3·d_model), nested once, so LENGTH · width · eps · scale bounds the discrepancy."""
    width = 3 * core.config.d_model
    return LENGTH * width * EPS * scale


def count_floats(state) -> int:
    """Floats in a state made of tensors (complex entries count as two), dicts or lists."""
    if isinstance(state, dict):
        return sum(count_floats(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(count_floats(v) for v in state)
    return (torch.view_as_real(state) if state.is_complex() else state).numel()


@pytest.mark.parametrize("family", FAMILIES)
def test_parallel_equals_sequential_float64(family):
    core = make_core(family)
    x = torch.randn(BATCH, LENGTH, core.config.d_model, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        parallel = core(x)
        sequential, _ = core.forward_sequential(x)
    tolerance = rounding_tolerance(core, parallel.abs().max().item())
    assert (parallel - sequential).abs().max().item() <= tolerance


@pytest.mark.parametrize("family", FAMILIES)
def test_causal(family):
    core = make_core(family)
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(BATCH, LENGTH, core.config.d_model, dtype=torch.float64, generator=generator)
    cut = LENGTH // 2
    changed = x.clone()
    changed[:, cut + 1:] = torch.randn(BATCH, LENGTH - cut - 1, core.config.d_model,
                                       dtype=torch.float64, generator=generator)
    with torch.no_grad():
        before, after = core(x), core(changed)
    # Positions up to `cut` see identical inputs through identical operations: bit-equal.
    assert torch.equal(before[:, :cut + 1], after[:, :cut + 1])
    # And the test is not vacuous: the next position does react to the change.
    assert not torch.allclose(before[:, cut + 1], after[:, cut + 1])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("length", [3, LENGTH])  # Griffin: shorter and longer than the window
def test_state_size_counts_carried_state(family, length):
    core = make_core(family)
    x = torch.randn(BATCH, length, core.config.d_model, dtype=torch.float64)
    with torch.no_grad():
        _, state = core.forward_sequential(x)
    assert count_floats(state) == BATCH * core.state_size(length)


def test_griffin_state_size_formula():
    """The count for the default pattern RRA, written out: two recurrent blocks of width
    D_RNN carry D_RNN + 3·D_RNN floats, the attention block keys and values of one head."""
    core = make_core("griffin")
    cfg = core.config
    width, head_dim = rnn_width(cfg), cfg.d_model // cfg.n_heads
    assert cfg.block_pattern == "RRA" and cfg.conv_width == 4
    for length in (3, LENGTH):
        expected = 2 * (width + 3 * width) + 2 * head_dim * min(length, cfg.window)
        assert core.state_size(length) == expected


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["tokens", "vectors"])
def test_training_step(family, kind):
    """Forward, backward and one SGD step in float64. A small step η along -g must lower the
    loss by η‖g‖² to first order; the second-order remainder is η²·gᵀHg/2, so with
    η‖g‖² ≤ 1e-4·loss the measured decrease matches the prediction to well within 10%."""
    torch.manual_seed(3)
    vocab, d_in, d_out = 5, 3, 2
    io = (IOSpec("tokens", vocab, vocab, 32) if kind == "tokens"
          else IOSpec("vectors", d_in, d_out, 32))
    model = build_model(family, small_config(family), io).double()
    if kind == "tokens":
        inputs = torch.randint(vocab, (4, 16))
        targets = torch.randint(vocab, (4, 16))
    else:
        inputs = torch.randn(4, 16, d_in, dtype=torch.float64)
        targets = torch.randn(4, 16, d_out, dtype=torch.float64)

    def loss_fn():
        out = model(inputs)
        if kind == "tokens":
            return F.cross_entropy(out.reshape(-1, vocab), targets.reshape(-1))
        return F.mse_loss(out, targets)

    loss = loss_fn()
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert all(g.abs().sum() > 0 for g in grads), "a parameter receives no gradient"
    grad_sq = sum((g ** 2).sum() for g in grads).item()
    lr = 1e-4 * loss.item() / grad_sq
    before = [p.detach().clone() for p in model.parameters()]
    torch.optim.SGD(model.parameters(), lr=lr).step()
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    with torch.no_grad():
        decrease = loss.item() - loss_fn().item()
    assert decrease == pytest.approx(lr * grad_sq, rel=0.1)


def test_adam_step_runs_in_float32():
    """The default dtype path used in training: every family takes an Adam step in float32."""
    for family in FAMILIES:
        torch.manual_seed(4)
        model = build_model(family, small_config(family), IOSpec("vectors", 3, 2, 32))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        inputs, targets = torch.randn(4, 16, 3), torch.randn(4, 16, 2)
        loss = F.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        assert torch.isfinite(loss) and all(torch.isfinite(p).all() for p in model.parameters())


def test_lru_initialisation_matches_definition():
    """λ = exp(-exp(ν_log) + i·exp(θ_log)) lies on the ring [r_min, r_max] with phase in
    [0, max_phase], and γ = sqrt(1 - |λ|²) at initialisation. Built in float64 so that the
    only error is rounding: 1 - |λ|² cancels to relative precision eps / (1 - r_max²)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(6)
        core = model_families()["lru"](small_config("lru"), IOSpec("vectors", 3, 2, 64))
    finally:
        torch.set_default_dtype(default)
    cfg = core.config
    for block in core.blocks:
        layer = block.lru
        eigenvalues = layer.eigenvalues(torch.float64)
        modulus = eigenvalues.abs()
        assert ((modulus >= cfg.r_min - 1e-12) & (modulus <= cfg.r_max + 1e-12)).all()
        assert (torch.exp(layer.theta_log) <= cfg.max_phase).all()
        gamma = torch.exp(layer.gamma_log)
        torch.testing.assert_close(gamma, torch.sqrt(1 - modulus ** 2),
                                   rtol=16 * EPS / (1 - cfg.r_max ** 2), atol=0.0)


def test_rglru_initialisation_matches_definition():
    """a = σ(Λ) with a^c in [0.9, 0.999] (c = 8) at initialisation. Λ was rounded to float32
    before `.double()`; a^c moves by c·a^c·(1-a)·|δΛ| <= c·|Λ|·eps32 (|Λ| < 10 here): the
    slack."""
    core = make_core("griffin")
    low, high = DECAY_INIT
    slack = GATE_EXPONENT * 10 * torch.finfo(torch.float32).eps
    for block in core.blocks:
        if block.kind == "R":
            a_param = block.mix.rg_lru.a_param
            assert a_param.abs().max() < 10
            a_c = torch.sigmoid(a_param) ** GATE_EXPONENT
            assert ((a_c >= low - slack) & (a_c <= high + slack)).all()
            # Spread over the interval: n uniform draws span less than half of it with
            # probability n·2^(1-n), negligible for the n = D_RNN = 43 channels here.
            assert a_c.max() - a_c.min() > 0.5 * (high - low)
