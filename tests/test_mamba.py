"""The Mamba-2 core and MambaZero: the mixer against a hand computation written with explicit
loops, causality for every ablation, chunked == sequential scan, state size, parameter names,
and MambaZero's constructions of paper 000: Theorem 1 reproducing the add-beta (Laplace)
estimator exactly, Theorem 4 (d = 2) within its ε, each against a perturbed copy that must fail.

Identities are checked in float64; 1e-10 is far above the round-off of these few-hundred-step
computations (~1e-13) and far below the size of any wrong term."""
from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

import models.mamba as mamba_module
from models import IOSpec, build_model, model_families
from models.ssd import ssd_chunked
from models.mamba import Mamba, MambaConfig, MambaZero, MambaZeroConfig
from conftest import own_fields

TOL = 1e-10
TOKENS = IOSpec("tokens", 3, 3, 64)

ABLATIONS = {
    "default": {},
    "no_conv": {"conv": False},
    "no_decay": {"decay": False},
    "relu": {"activation": "relu"},
    "identity": {"activation": "identity"},
    "no_gate": {"gate": False},
    "no_mlp": {"mlp": False},
}
# Small but not degenerate: 4 heads in 2 groups, chunks shorter than the sequence.
SMALL = dict(d_model=8, expand=2, headdim=4, ngroups=2, d_state=3, d_conv=3, chunk_size=8)


def small_core(seed=0, **overrides) -> Mamba:
    torch.manual_seed(seed)
    config = MambaConfig(**{**SMALL, "n_layers": 2, "kernel": "torch", **overrides})
    return Mamba(config, TOKENS).double()


def reference_mixer(mixer, u):
    """The Mamba-2 mixer by its equations, one time step and one head at a time."""
    batch, length, _ = u.shape
    d_inner, heads, headdim = mixer.d_inner, mixer.nheads, mixer.headdim
    groups, states = mixer.ngroups, mixer.d_state
    act = {"silu": F.silu, "relu": F.relu, "identity": lambda t: t}[mixer.activation_name]
    proj = u @ mixer.in_proj.weight.T
    d_z = d_inner if mixer.gate else 0
    z, xBC, dt_raw = proj[..., :d_z], proj[..., d_z:-heads], proj[..., -heads:]
    if mixer.conv1d is not None:
        weight, window = mixer.conv1d.weight[:, 0], mixer.conv1d.weight.shape[-1]
        convolved = torch.zeros_like(xBC) + mixer.conv1d.bias
        for t in range(length):
            for lag in range(min(window, t + 1)):  # weight[:, -1] multiplies the current input
                convolved[:, t] += weight[:, window - 1 - lag] * xBC[:, t - lag]
        xBC = convolved
    xBC = act(xBC)
    x = xBC[..., :d_inner].reshape(batch, length, heads, headdim)
    B = xBC[..., d_inner:d_inner + groups * states].reshape(batch, length, groups, states)
    C = xBC[..., d_inner + groups * states:].reshape(batch, length, groups, states)
    dt = torch.log1p(torch.exp(dt_raw + mixer.dt_bias))
    a = (torch.exp(-torch.exp(mixer.A_log) * dt) if mixer.A_log is not None
         else torch.ones_like(dt))
    y = torch.zeros(batch, length, heads, headdim, dtype=u.dtype)
    for h in range(heads):
        g = h // (heads // groups)
        state = torch.zeros(batch, headdim, states, dtype=u.dtype)
        for t in range(length):
            state = (a[:, t, h, None, None] * state
                     + dt[:, t, h, None, None] * x[:, t, h, :, None] * B[:, t, g, None, :])
            y[:, t, h] = (state @ C[:, t, g, :, None])[..., 0]
            if mixer.D is not None:
                y[:, t, h] += mixer.D[h] * x[:, t, h]
    y = y.reshape(batch, length, d_inner)
    if mixer.gate:
        y = y * act(z)
    if mixer.norm is not None:
        y = y.reshape(batch, length, groups, -1)
        y = y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + mixer.norm.eps)
        y = y.reshape(batch, length, d_inner) * mixer.norm.weight
    return y @ mixer.out_proj.weight.T


@pytest.mark.parametrize("ablation", [a for a in ABLATIONS if a != "no_mlp"])
def test_mixer_matches_hand_computation(ablation):
    mixer = small_core(**ABLATIONS[ablation]).layers[0].mixer
    u = torch.randn(2, 11, SMALL["d_model"], generator=torch.Generator().manual_seed(1),
                    dtype=torch.float64)
    torch.testing.assert_close(mixer(u), reference_mixer(mixer, u), rtol=0, atol=TOL)


def test_no_decay_means_transition_factor_one():
    """decay=False: no A_log at all, and the state is a plain running sum. On a tiny mixer with
    one head, one state and an identity-like path this is checked by hand: with x_t = B_t = 1
    and C_t = 1 the SSM output is sum_{s<=t} dt_s, which a decaying state could not give."""
    mixer = small_core(decay=False).layers[0].mixer
    assert mixer.A_log is None and "A_log" not in dict(mixer.named_parameters())
    assert torch.equal(mixer.decay_rate(), torch.zeros(mixer.nheads, dtype=torch.float64))
    dt = torch.tensor([[[0.5], [0.25], [2.0], [1.0]]], dtype=torch.float64)
    ones = torch.ones(1, 4, 1, 1, dtype=torch.float64)
    y, state = mamba_module.ssd_scan(ones, dt, mixer.decay_rate()[:1], ones, ones,
                                     chunk_size=3, kernel="torch")
    torch.testing.assert_close(y[0, :, 0, 0], torch.tensor([0.5, 0.75, 2.75, 3.75],
                                                           dtype=torch.float64))
    assert state.item() == pytest.approx(3.75)


@pytest.mark.parametrize("ablation", list(ABLATIONS))
def test_core_is_causal(ablation):
    core = small_core(**ABLATIONS[ablation])
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 30, SMALL["d_model"], generator=g, dtype=torch.float64)
    changed = x.clone()
    cut = 13  # inside the second chunk of 8
    changed[:, cut + 1:] = torch.randn(2, 30 - cut - 1, SMALL["d_model"], generator=g,
                                       dtype=torch.float64)
    out, out_changed = core(x), core(changed)
    torch.testing.assert_close(out[:, :cut + 1], out_changed[:, :cut + 1], rtol=0, atol=TOL)
    assert (out[:, cut + 1:] - out_changed[:, cut + 1:]).abs().max() > 1e-3


def test_mambazero_is_causal():
    torch.manual_seed(0)
    model = build_model("mambazero", MambaZeroConfig(chunk_size=4, kernel="torch"),
                        IOSpec("tokens", 2, 2, 32)).double()
    tokens = torch.randint(0, 2, (3, 20))
    changed = tokens.clone()
    changed[:, 10:] = 1 - changed[:, 10:]
    torch.testing.assert_close(model(tokens)[:, :10], model(changed)[:, :10], rtol=0, atol=TOL)


@pytest.mark.parametrize("ablation", ["default", "no_decay", "no_gate"])
def test_chunked_scan_layer_equals_sequential_scan_layer(ablation):
    chunked = small_core(**ABLATIONS[ablation])
    sequential = small_core(seed=1, **{**ABLATIONS[ablation], "kernel": "sequential"})
    sequential.load_state_dict(chunked.state_dict())
    x = torch.randn(2, 21, SMALL["d_model"], generator=torch.Generator().manual_seed(3),
                    dtype=torch.float64)
    outputs, grads = [], []
    for core in (chunked, sequential):
        out = core(x)
        outputs.append(out)
        grads.append(torch.autograd.grad(out.pow(2).sum(), list(core.parameters())))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=TOL)
    for (name, _), g_chunk, g_seq in zip(chunked.named_parameters(), *grads):
        torch.testing.assert_close(g_chunk, g_seq, rtol=0, atol=TOL, msg=name)


@pytest.mark.parametrize("ablation", ["default", "no_conv", "no_decay", "no_gate"])
def test_state_size_matches_carried_tensors(ablation, monkeypatch):
    """state_size == the final SSM states the scan actually returns + the d_conv-1 past conv
    inputs each convolution needs (read off the conv weight), summed over layers."""
    final_states = []

    def recording_scan(*args, **kwargs):
        y, final = ssd_chunked(*args, D=kwargs["D"], chunk_size=kwargs["chunk_size"])
        final_states.append(final)
        return y, final

    monkeypatch.setattr(mamba_module, "ssd_scan", recording_scan)
    core = small_core(**ABLATIONS[ablation])
    core(torch.randn(1, 9, SMALL["d_model"], dtype=torch.float64))
    conv_window = sum(block.mixer.conv1d.weight.shape[0] * (block.mixer.conv1d.weight.shape[-1] - 1)
                      for block in core.layers if block.mixer.conv1d is not None)
    expected = sum(state[0].numel() for state in final_states) + conv_window
    assert len(final_states) == core.config.n_layers
    assert core.state_size(64) == expected


def test_state_size_of_the_default_configs():
    # Mamba: 1 head x headdim 32 x d_state 16 + (4 - 1) x (32 + 2 x 16) conv inputs.
    assert build_model("mamba", MambaConfig(), TOKENS).state_size(128) == 32 * 16 + 3 * 64
    # MambaZero: 1 head x 4 x 2 + (2 - 1) x (4 + 2 x 2).
    assert build_model("mambazero", MambaZeroConfig(), TOKENS).state_size(128) == 8 + 8


def test_parameter_names_follow_mamba_ssm():
    names = set(dict(small_core().named_parameters()))
    for suffix in ["in_proj.weight", "conv1d.weight", "conv1d.bias", "dt_bias", "A_log", "D",
                   "norm.weight", "out_proj.weight"]:
        assert f"layers.0.mixer.{suffix}" in names
    assert {"layers.0.norm.weight", "layers.0.norm2.weight", "layers.0.mlp.fc1.weight",
            "layers.0.mlp.fc2.weight", "norm_f.weight"} <= names
    mixer = small_core().layers[0].mixer
    d_inner, groups, states, heads = 16, 2, 3, 4
    assert mixer.in_proj.weight.shape == (2 * d_inner + 2 * groups * states + heads, 8)
    assert mixer.conv1d.weight.shape == (d_inner + 2 * groups * states, 1, SMALL["d_conv"])
    assert mixer.dt_bias.shape == mixer.A_log.shape == mixer.D.shape == (heads,)


def test_ablations_remove_their_parameters():
    assert small_core(conv=False).layers[0].mixer.conv1d is None
    no_gate = small_core(gate=False).layers[0].mixer
    assert no_gate.in_proj.weight.shape[0] == 16 + 2 * 2 * 3 + 4  # no z
    assert small_core(mlp=False).layers[0].mlp is None


def test_initialisation_follows_mamba2():
    torch.manual_seed(0)
    mixer = Mamba(MambaConfig(d_model=64, headdim=2), TOKENS).layers[0].mixer  # 64 heads
    dt = F.softplus(mixer.dt_bias)
    assert dt.min() >= 1e-3 - 1e-9 and dt.max() <= 0.1 + 1e-9
    A = torch.exp(mixer.A_log)
    assert A.min() >= 1.0 and A.max() <= 16.0
    assert torch.equal(mixer.D, torch.ones(64))


@pytest.mark.parametrize("fields, message", [
    ({"headdim": 5}, "divisible by headdim"),
    ({"ngroups": 3}, "must divide n_heads"),
    ({"activation": "tanh"}, "activation"),
    ({"kernel": "cuda"}, "kernel"),
    ({"n_layers": 0}, "n_layers"),
])
def test_config_errors_are_clear(fields, message):
    with pytest.raises(ValueError, match=message):
        MambaConfig(**fields)


def test_yaml_defaults_equal_the_dataclasses():
    from omegaconf import OmegaConf
    for name, config_class in [("mamba", MambaConfig), ("mambazero", MambaZeroConfig)]:
        fields = OmegaConf.to_container(OmegaConf.load(f"conf/model/{name}.yaml"))
        assert fields.pop("family") == name
        defaults = dataclasses.asdict(config_class())
        assert fields == {k: v for k, v in defaults.items() if k in own_fields(config_class)}
    constructed = OmegaConf.to_container(OmegaConf.load("conf/model/mambazero_constructed.yaml"))
    assert constructed.pop("family") == "mambazero"
    assert set(constructed) == own_fields(MambaZeroConfig)
    assert constructed["constructed"] is True
    MambaZeroConfig(**constructed)


def test_mambazero_l1_prediction_gives_log_probabilities():
    torch.manual_seed(0)
    model = build_model("mambazero", MambaZeroConfig(l1_prediction=True),
                        IOSpec("tokens", 3, 3, 64))
    tokens = torch.randint(0, 3, (4, 25))
    log_probs = model.predict(tokens)
    assert torch.isfinite(log_probs).all() and (log_probs <= 0).all()
    torch.testing.assert_close(log_probs.logsumexp(-1), torch.zeros(4, 25), rtol=0, atol=1e-6)
    # The definition: clamp the head's scores at the floor, divide by their sum.
    core = model.core
    x = core.embedding(tokens)
    scores = core.lm_head(x + core.mixer(x)).clamp(min=mamba_module.L1_FLOOR)
    torch.testing.assert_close(log_probs, (scores / scores.sum(-1, keepdim=True)).log())
    with pytest.raises(ValueError, match="tokens"):
        MambaZero(MambaZeroConfig(l1_prediction=True), IOSpec("vectors", 2, 1, 64))


def laplace_estimator(tokens, beta, symbols):
    """Add-beta estimate of P(x_{t+1} = j | x_1^t) from the transition counts out of x_t."""
    batch, length = tokens.shape
    probs = torch.zeros(batch, length, symbols, dtype=torch.float64)
    for b in range(batch):
        counts = torch.zeros(symbols, symbols, dtype=torch.float64)
        for t in range(length):
            if t > 0:
                counts[tokens[b, t - 1], tokens[b, t]] += 1
            row = counts[tokens[b, t]]
            probs[b, t] = (row + beta) / (row.sum() + symbols * beta)
    return probs


# --- the paper's constructions (paper 000 App. C.2-C.3) --------------------------------------
EXACT = 1e-12  # float64: the constructed model sums integer counts and divides once


def constructed_mambazero(symbols: int, beta: float, d_model: int, d_state: int,
                          epsilon: float = 0.01):
    """The constructed model built in float64 from the start, so β and softplus⁻¹(1) are not
    rounded to float32 first (that alone costs ~5e-7 in the probabilities)."""
    config = MambaZeroConfig(d_model=d_model, d_state=d_state, headdim=d_model, decay=False,
                             l1_prediction=True, constructed=True, beta=beta, epsilon=epsilon,
                             kernel="torch", chunk_size=16)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return build_model("mambazero", config, IOSpec("tokens", symbols, symbols, 64))
    finally:
        torch.set_default_dtype(default)


def markov_batch(symbols: int, beta: float, order: int = 1, seq_len: int = 60, n: int = 64):
    from tasks.markov import MarkovConfig, MarkovTask
    task = MarkovTask(MarkovConfig(order=order, vocab_size=symbols, beta=beta, seq_len=seq_len))
    return task, task.held_out(n)


def kl_and_abs(reference_log_probs, model_log_probs) -> tuple[float, float]:
    """max KL(reference ‖ model) and max |p - q| over positions, sequences and symbols."""
    model_log_probs = model_log_probs.detach()
    p = reference_log_probs.exp()
    kl = (p * (reference_log_probs - model_log_probs)).sum(-1)
    return float(kl.max()), float((p - model_log_probs.exp()).abs().max())


@pytest.mark.parametrize("symbols,beta", [(2, 1.0), (2, 0.3), (3, 1.0), (3, 0.3)])
def test_theorem_1_construction_is_add_beta(symbols, beta):
    """Thm. 1: with N = S, d = 2S, e = 1, w = 2 the prediction is add-β for first-order chains
    at every position, the first included (no transition yet: uniform), against both the task's
    `bayes` reference and the estimator written out with explicit counts."""
    model = constructed_mambazero(symbols, beta, 2 * symbols, symbols)
    task, batch = markov_batch(symbols, beta)
    predicted = model.predict(batch.inputs)
    kl, gap = kl_and_abs(task.add_beta(batch), predicted)
    assert kl < EXACT and gap < EXACT
    torch.testing.assert_close(predicted.exp(), laplace_estimator(batch.inputs, beta, symbols),
                               rtol=0, atol=EXACT)


def theorem_4_prediction(tokens, beta: float, epsilon: float):
    """Paper 000 Eq. 30-31: add-β, except that when x_1 = x_t the count of the other symbol
    gets an extra βε."""
    batch, length = tokens.shape
    probs = torch.zeros(batch, length, 2, dtype=torch.float64)
    for b in range(batch):
        n = torch.zeros(2, 2, dtype=torch.float64)
        for t in range(length):
            if t > 0:
                n[tokens[b, t - 1], tokens[b, t]] += 1
            current = int(tokens[b, t])
            scores = n[current] + beta
            if current == int(tokens[b, 0]):
                scores[1 - current] += beta * epsilon
            probs[b, t] = scores / scores.sum()
    return probs


@pytest.mark.parametrize("beta", [1.0, 0.3])
@pytest.mark.parametrize("epsilon", [0.1, 1e-3, 1e-6])
def test_theorem_4_construction_is_within_epsilon_of_add_beta(beta, epsilon):
    """Thm. 4: binary chains with d = N = 2. The model computes the paper's Eq. 30-31 exactly,
    so KL(add-β ‖ model) <= log(1 + ε) (the theorem); the worst case is at n = 0 with x_1 = x_t,
    uniform against (1, 1 + ε)/(2 + ε): KL = ½ log(1 + ε²/(4(1 + ε))) and |p - q| = ε/(4 + 2ε),
    far inside the bound, and it shrinks like ε² (ε in probability)."""
    model = constructed_mambazero(2, beta, 2, 2, epsilon)
    task, batch = markov_batch(2, beta)
    predicted = model.predict(batch.inputs)
    torch.testing.assert_close(predicted.exp(), theorem_4_prediction(batch.inputs, beta, epsilon),
                               rtol=0, atol=EXACT)
    kl, gap = kl_and_abs(task.add_beta(batch), predicted)
    assert kl <= math.log1p(epsilon)
    assert kl == pytest.approx(0.5 * math.log1p(epsilon**2 / (4 * (1 + epsilon))),
                               rel=1e-6, abs=1e-15)
    assert gap == pytest.approx(epsilon / (4 + 2 * epsilon), rel=1e-6)


PERTURBATIONS = {  # one entry of one constructed parameter each, moved by 0.1
    "embedding": lambda core: core.embedding.weight[0, 0],
    "W_B": lambda core: core.mixer.in_proj.weight[core.mixer.d_inner, 0],
    "conv_B_previous_tap": lambda core: core.mixer.conv1d.weight[core.mixer.d_inner, 0, 0],
    "conv_X_current_tap": lambda core: core.mixer.conv1d.weight[1, 0, 1],
    "dt_bias": lambda core: core.mixer.dt_bias[0],
    "W_o": lambda core: core.mixer.out_proj.weight[1, 1],
    "W_l": lambda core: core.lm_head.weight[0, 0],
}


@pytest.mark.parametrize("name", PERTURBATIONS)
@pytest.mark.parametrize("theorem", [1, 4])
def test_a_perturbed_construction_is_not_add_beta(name, theorem):
    """Negative control: the comparison can fail. Moving any one of the construction's entries
    by 0.1 puts the prediction at least 1e-3 from add-β (Thm. 4 with ε = 1e-6 is within 3e-7)."""
    symbols, beta = 2, 1.0
    d_model = 4 if theorem == 1 else 2
    model = constructed_mambazero(symbols, beta, d_model, 2, epsilon=1e-6)
    with torch.no_grad():
        PERTURBATIONS[name](model.core).add_(0.1)
    task, batch = markov_batch(symbols, beta)
    gap = kl_and_abs(task.add_beta(batch), model.predict(batch.inputs))[1]
    assert gap > 1e-3, (name, gap)


def test_constructed_preset_through_the_runner():
    """`model=mambazero_constructed` as a run builds it (float32): add-β to float32 rounding on
    the task's held-out sequences (β = 0.5 set on both sides), and the constructed parameters
    stay trainable (every one gets a gradient)."""
    from bench.training.checks import compose_checked
    from bench.training.evaluate import masked_loss
    from bench.training.train import build
    task, net = build(compose_checked(["task=markov", "task.beta=0.5", "task.seq_len=64",
                                       "model=mambazero_constructed", "model.beta=0.5"]))
    batch = task.held_out(32)
    assert kl_and_abs(task.add_beta(batch), net.predict(batch.inputs).double())[1] < 1e-5
    masked_loss(task, net(batch.inputs), batch).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())


@pytest.mark.parametrize("overrides,message", [
    (["model.decay=true"], "decay=false"),
    (["model.l1_prediction=false"], "l1_prediction=true"),
    (["model.d_conv=3"], "d_conv=2"),
    (["model.expand=2", "model.headdim=8"], "expand=1"),
    (["model.d_model=6", "model.headdim=6"], "canonical sizes"),
    (["model.epsilon=0"], "epsilon"),
    (["task.vocab_size=3"], "d_model=6, d_state=3"),
    (["task=lgssm"], "tokens task"),
])
def test_constructed_preset_refuses_what_the_theorems_do_not_cover(overrides, message):
    from bench.training.checks import compose_checked
    from bench.config import ConfigError
    args = ["task=markov", "model=mambazero_constructed"]
    args = [a for a in args if not any(o.split("=")[0] == a.split("=")[0] for o in overrides)]
    with pytest.raises(ConfigError, match=message):
        compose_checked([*args, *overrides])


# --- orders k > 1: no construction exists with a_t = 1 (the paper's Conjecture 1 regime) ---------
def all_binary_sequences(length: int) -> torch.Tensor:
    return torch.tensor(list(itertools.product((0, 1), repeat=length)))


def mambazero_logit_span(tokens: torch.Tensor, window: int) -> torch.Tensor:
    """(n, T, columns) spanning, at every position, every logit of every one-layer MambaZero with
    a_t = 1 and d_conv = window, whatever its widths, heads and groups: logit_t = W_ℓ e_{x_t} +
    Σ_s Δ_s (W_ℓ W_o x~_s)(b_s · c_t), where x~_s, b_s are affine in the indicators
    [x_{s-m} = a] (m < window: the convolution, its bias and zero padding), Δ_s is a function of
    x_s (Δ reads the current token only) and c_t is affine in the indicators at t. So logit_t is
    a function of x_t plus Σ_r φ_r(t) ⟨w_r, h(t)⟩ with φ = (1, indicators at t) and h(t) the
    prefix sums of [x_s = a]·ℓ·ℓ' over literals ℓ, ℓ' ∈ {1, indicators at s}."""
    n, length = tokens.shape
    onehot = F.one_hot(tokens, 2).double()
    lagged = [F.pad(onehot, (0, 0, m, 0))[:, :length] for m in range(window)]
    literals = torch.cat([onehot.new_ones(n, length, 1), *lagged], -1)
    i, j = torch.triu_indices(literals.shape[-1], literals.shape[-1])
    monomials = (onehot[..., :, None] * (literals[..., i] * literals[..., j])[..., None, :])
    history = monomials.flatten(-2).cumsum(1)
    return torch.cat([onehot, (literals[..., :, None] * history[..., None, :]).flatten(-2)], -1)


def numerical_rank(matrix: torch.Tensor) -> int:
    """Rank with a visible gap: the singular values of these integer-count matrices are either
    below 1e-13 or above 1e-5 of the largest, so the 1e-9 threshold is not a judgement call."""
    values = torch.linalg.svdvals(matrix) / torch.linalg.matrix_norm(matrix, ord=2)
    assert not ((values > 1e-13) & (values < 1e-5)).any()
    return int((values > 1e-9).sum())


@pytest.mark.parametrize("order,window,length", [(1, 2, 7), (2, 3, 7), (3, 4, 8)])
def test_one_layer_mambazero_with_unit_decay_holds_add_beta_of_order_one_only(order, window,
                                                                              length):
    """Thm. 1 is first-order; arXiv Conjecture 1 says d = N = 2^(k+1), w = k + 1 gets
    arbitrarily close to add-β of order k. With a_t = 1 (both proofs' and Fig. 4's regime) and
    positive scores (no clamping) it cannot, at any width: on binary sequences of up to `length`
    tokens (every position after the first full context, β = 1), a logit vector in the span
    above whose L1 normalisation is add-β must satisfy logit_0 (n_1 + β) = logit_1 (n_0 + β),
    and for k = 2, 3 the only solution is zero there: rank([M; L]) = rank(M) for the constraint
    rows M and the logit rows L. A sequence of models approaching add-β would, rescaled, converge
    to a non-zero solution, so even an approximation is out of reach. For k = 1 (the control)
    non-zero solutions exist: Theorem 1's. First, a random MambaZero (2 heads, conv bias,
    selective Δ) is checked to lie in the span, so the span is the model's and not an idea of it.
    """
    sequences = all_binary_sequences(length + 1)
    inputs, targets = sequences[:, :-1], sequences[:, 1:]
    span = mambazero_logit_span(inputs, window)
    torch.manual_seed(0)
    config = MambaZeroConfig(d_model=8, d_state=5, headdim=4, d_conv=window, decay=False,
                             kernel="torch")
    core = build_model("mambazero", config, IOSpec("tokens", 2, 2, 64)).double().core
    with torch.no_grad():
        for param in core.parameters():
            param.copy_(torch.randn_like(param) * 0.5)
        embedded = core.embedding(inputs)
        logits = core.lm_head(embedded + core.mixer(embedded)).reshape(-1, 2)
    columns = span.reshape(-1, span.shape[-1])
    fit = torch.linalg.lstsq(columns, logits, driver="gelsd").solution
    assert (columns @ fit - logits).norm() < 1e-10 * logits.norm()

    from tasks.markov import context_ids, counts_in_context
    first = order  # the positions after the first full context (that one admits solutions)
    scores = (counts_in_context(context_ids(inputs, order, 2), targets, 2) + 1.0)[:, first:]
    rows = span[:, first:].reshape(-1, span.shape[-1])
    scores = scores.reshape(-1, 2)
    zero = torch.zeros_like(rows)
    constraints = torch.unique(torch.cat([rows * scores[:, 1:], -rows * scores[:, :1]], 1), dim=0)
    logit_rows = torch.unique(torch.cat([torch.cat([rows, zero], 1), torch.cat([zero, rows], 1)]),
                              dim=0)
    solutions_have_logits = (numerical_rank(torch.cat([constraints, logit_rows]))
                             > numerical_rank(constraints))
    assert solutions_have_logits == (order == 1)


def test_mambazero_l1_scores_start_positive_so_none_is_clamped():
    """A clamped score has no gradient; the L1 variant must start with every score positive."""
    from models.mamba import MambaZero, MambaZeroConfig
    torch.manual_seed(0)
    core = MambaZero(MambaZeroConfig(l1_prediction=True), IOSpec("tokens", 2, 2, 64))
    tokens = torch.randint(0, 2, (16, 64))
    x = core.embedding(tokens)
    scores = core.lm_head(x + core.mixer(x))
    assert (scores > 0).all()


# --- the decay probe (paper 000 Fig. 13) ---------------------------------------------------------
@pytest.mark.parametrize("ablation", ["default", "no_decay", "no_conv"])
def test_probe_decays_are_the_scan_decays(ablation, monkeypatch):
    """Core.probe's "decay" is exp(Δ_t A) exactly as the forward pass hands it to the scan, for
    every layer and head (captured from ssd_scan's arguments); 1 without the decay."""
    core = small_core(**ABLATIONS[ablation])
    seen = []
    scan = mamba_module.ssd_scan

    def spy(x, dt, A, *args, **kwargs):
        seen.append(torch.exp(dt * A))
        return scan(x, dt, A, *args, **kwargs)

    monkeypatch.setattr(mamba_module, "ssd_scan", spy)
    x = torch.randn(2, 13, SMALL["d_model"], generator=torch.Generator().manual_seed(4),
                    dtype=torch.float64)
    core(x)
    assert len(seen) == 2
    decay = core.probe(x)["decay"]
    assert decay.shape == (2, 13, 2, 4)
    for layer in range(2):
        torch.testing.assert_close(decay[:, :, layer], seen[layer], rtol=0, atol=TOL)
    if ablation == "no_decay":
        assert torch.equal(decay, torch.ones_like(decay))
    else:
        assert decay.min() > 0 and decay.max() < 1 and decay.std() > 1e-3


def test_mambazero_and_backbone_probe():
    torch.manual_seed(0)
    model = build_model("mambazero", MambaZeroConfig(), TOKENS)
    tokens = torch.randint(0, 3, (2, 9))
    decay = model.probe(tokens)["decay"]
    mixer = model.core.mixer
    assert decay.shape == (2, 9, 1, mixer.nheads)
    torch.testing.assert_close(decay[:, :, 0], mixer.decays(model.core.embedding(tokens)))
    lstm = build_model("lstm", model_families()["lstm"].Config(), TOKENS)
    assert lstm.probe(tokens) == {}  # a core without probes


# --- the count-mechanism probes (paper 000 App. C.1, Fig. 5) ------------------------------------
def test_mambazero_probe_is_the_scan_inputs_and_writes_out_the_logit(monkeypatch):
    """"ssm_b"/"ssm_c" are the B and C the forward pass hands to the scan; with a_t = 1 the logit
    probes decompose the logit exactly as Eq. (4)-(5): logit_t = logit_direct_t + Σ_{s<=t} Σ_g
    logit_write_{s,g} (b_{s,g} · c_{t,g}) (4 heads in 2 groups, random weights and conv bias).
    Without the L1 head there are no logit probes."""
    torch.manual_seed(0)
    config = MambaZeroConfig(d_model=8, d_state=3, headdim=2, ngroups=2, decay=False,
                             l1_prediction=True, kernel="torch", chunk_size=4)
    model = build_model("mambazero", config, IOSpec("tokens", 3, 3, 64)).double()
    core = model.core
    with torch.no_grad():
        for param in core.parameters():
            param.copy_(torch.randn_like(param) * 0.5)
    seen = []
    scan = mamba_module.ssd_scan

    def spy(x, dt, A, B, C, *args, **kwargs):
        seen.append((B, C))
        return scan(x, dt, A, B, C, *args, **kwargs)

    monkeypatch.setattr(mamba_module, "ssd_scan", spy)
    tokens = torch.randint(0, 3, (4, 13))
    embedded = core.embedding(tokens)
    logits = core.lm_head(embedded + core.mixer(embedded)).detach()
    found = model.probe(tokens)
    assert set(found) == {"decay", "ssm_b", "ssm_c", "logit_direct", "logit_write"}
    assert found["ssm_b"].shape == found["ssm_c"].shape == (4, 13, 2, 3)
    assert found["logit_write"].shape == (4, 13, 2, 3)
    torch.testing.assert_close(found["ssm_b"], seen[0][0], rtol=0, atol=TOL)
    torch.testing.assert_close(found["ssm_c"], seen[0][1], rtol=0, atol=TOL)
    inner = torch.einsum("bsgn,btgn->bstg", found["ssm_b"], found["ssm_c"])
    causal = torch.ones(13, 13, dtype=torch.bool).triu()[None, :, :, None]  # s <= t
    written = torch.einsum("bsgd,bstg->btd", found["logit_write"], inner * causal)
    torch.testing.assert_close(found["logit_direct"] + written, logits, rtol=0, atol=TOL)
    assert (written.abs().max() > 0.1) and (found["logit_direct"].abs().max() > 0.1)
    softmax = build_model("mambazero", dataclasses.replace(config, l1_prediction=False),
                          IOSpec("tokens", 3, 3, 64))
    assert set(softmax.probe(tokens)) == {"decay", "ssm_b", "ssm_c"}


def fig5_summary(model, symbols: int, beta: float) -> dict:
    """metrics.probe of `model` on the task's held-out sequences, as a run records it (float32)."""
    from bench.training.evaluate import probe_summary
    task, batch = markov_batch(symbols, beta, seq_len=48, n=32)
    return probe_summary(task, model, batch, batch_size=16)


@pytest.mark.parametrize("symbols,beta", [(2, 1.0), (2, 0.3), (3, 1.0)])
def test_fig5_probe_on_the_theorem_1_construction(symbols, beta):
    """App. C.1 on the Thm. 1 model: b^(ij)ᵀc^(k) = [i = k] (so the wrong-count ratio is 0),
    every count coefficient v^(kj)_j = 1 and the count-independent vector is β·1, so every
    coordinate's β estimate equals β to float32 precision (the record's probes are float32)."""
    summary = fig5_summary(constructed_mambazero(symbols, beta, 2 * symbols, symbols), symbols,
                           beta)
    assert summary["bc_wrong_ratio"] == 0.0
    for i, j, k in itertools.product(range(symbols), repeat=3):
        assert summary["bc_inner"][i][j][k] == float(i == k)
    for i, j, l, k in itertools.product(range(symbols), repeat=4):
        assert summary["bc_inner_by_window"][i][j][l][k] == float(i == k)
        assert summary["count_vector_scale"][l][k][j] == 1.0
    beta32 = float(torch.tensor(beta, dtype=torch.float32))
    assert summary["count_free_beta_min"] == summary["count_free_beta_max"] == beta32
    assert summary["decay_min"] == 1.0


def test_fig5_probe_can_fail():
    """Negative controls. Thm. 4's d = 2 model reaches add-β within ε without orthogonal counts:
    b^(10)ᵀc^(0) = γ_1 c_0 = -a c_0 against the smallest right one (γ_0 + γ_1) c_0 = (1 - a) c_0,
    a ratio a / (1 - a) with a² = βε / (1 + βε). Thm. 1 with conv_B's current tap at 0.1 makes
    b^(ij) = u_i + 0.1 u_j: b^(01)ᵀc^(1) = 0.1 against b^(01)ᵀc^(0) = 1, a ratio 0.1; W_ℓ's
    β entry for logit 0 moved by 0.1 moves that coordinate's β estimate to β + 0.1."""
    epsilon = 0.01
    a = math.sqrt(epsilon / (1 + epsilon))
    summary = fig5_summary(constructed_mambazero(2, 1.0, 2, 2, epsilon), 2, 1.0)
    assert summary["bc_wrong_ratio"] == pytest.approx(a / (1 - a), rel=1e-5)
    model = constructed_mambazero(2, 1.0, 4, 2)
    with torch.no_grad():
        model.core.mixer.conv1d.weight[model.core.mixer.d_inner:, 0, -1][:2] += 0.1
    assert fig5_summary(model, 2, 1.0)["bc_wrong_ratio"] == pytest.approx(0.1, rel=1e-5)
    model = constructed_mambazero(2, 1.0, 4, 2)
    with torch.no_grad():
        PERTURBATIONS["W_l"](model.core).add_(0.1)
    summary = fig5_summary(model, 2, 1.0)
    assert summary["bc_wrong_ratio"] == 0.0
    assert summary["count_free_beta_min"] == 1.0
    assert summary["count_free_beta_max"] == pytest.approx(1.1, rel=1e-6)


def test_fig5_probe_reaches_the_run_record(tmp_path):
    """A markov run of MambaZero with the L1 head writes Fig. 5's scalars into metrics.probe."""
    from bench.training.checks import compose_checked
    from bench.training.train import run
    record, _ = run(compose_checked(["task=markov", "task.seq_len=32", "model=mambazero",
                                     "model.l1_prediction=true", "trainer.max_steps=2",
                                     "trainer.eval_sequences=16", "trainer.bootstrap=20",
                                     "trainer.progress=false", "trainer.logger=none",
                                     f"out_dir={tmp_path}"]))
    probe = record["metrics"]["probe"]
    assert probe["bc_wrong_ratio"] >= 0 and len(probe["bc_inner_by_window"]) == 2
    assert probe["count_free_beta_min"] <= probe["count_free_beta_max"]
    assert probe["decay_min"] > 0


# --- convolution window vs Markov order (paper 000 Fig. 3b: w >= k + 1 needed) ----------------
@pytest.mark.parametrize("w", [2, 3, 4])
def test_d_conv_is_the_window_of_the_convolution(w):
    """model.d_conv is the paper's window w: the convolved x, B, C at step t depend on the
    mixer inputs at t - w + 1 .. t and on nothing earlier."""
    mixer = small_core(d_conv=w).layers[0].mixer
    assert mixer.conv1d.weight.shape == (mixer.conv_dim, 1, w)
    xBC = torch.randn(1, 10, mixer.conv_dim, generator=torch.Generator().manual_seed(5),
                      dtype=torch.float64)

    def conv(inputs):
        return mixer.conv1d(inputs.transpose(1, 2))[..., :10].transpose(1, 2)

    t = 8
    for lag in range(w + 2):
        moved = xBC.clone()
        moved[:, t - lag] += 1.0
        changed = (conv(moved)[:, t] - conv(xBC)[:, t]).abs().max() > 1e-6
        assert changed == (lag < w), (w, lag)


@pytest.mark.parametrize("model", ["mamba", "mambazero"])
@pytest.mark.parametrize("w", [2, 3, 4])
@pytest.mark.parametrize("order", [1, 2, 3])
def test_d_conv_composes_with_every_markov_order(model, w, order):
    """Paper 000 Fig. 3b's grid (w ∈ {2, 3, 4} × k ∈ {1, 2, 3}; the paper needs w >= k + 1 to
    learn): each pair composes from the CLI keys and takes a finite training step."""
    from bench.training.checks import compose_checked
    from bench.training.evaluate import masked_loss
    from bench.training.train import build
    config = compose_checked(["task=markov", f"task.order={order}", "task.seq_len=24",
                              f"model={model}", f"model.d_conv={w}", "trainer.batch_size=4"])
    assert config.model.d_conv == w and config.task.order == order
    task, net = build(config)
    batch = task.training_batch(0)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in net.parameters()]
    loss = masked_loss(task, net(batch.inputs), batch)
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss) and 0.5 < loss.item() < 2.0  # ~ln 2 for binary chains at init
    assert any(not torch.equal(a, p) for a, p in zip(before, net.parameters()))
