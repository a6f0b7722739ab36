"""Selective SSM core (paper 004): parallel forward against its sequential twin and against the
recurrence written out by hand, carried state = state_size, causality, (non-)selectivity, the
configuration files, and a training step for both task kinds. The scans themselves:
tests/test_scan.py.

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

from conftest import assert_causal, fits_a_fixed_batch, redraw_in_float64
from models import IOSpec, build_model, model_families
from models.selective_ssm import SelectiveSSM, SelectiveSSMConfig

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
    assert set(values) == {f.name for f in dataclasses.fields(SelectiveSSMConfig)}
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
