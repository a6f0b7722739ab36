"""The shared scans of models/scan.py: `sequential_scan` against the recurrence's closed form
h_t = Σ_{s≤t} (Π_{s<r≤t} a_r) b_s, then both parallel scans (`linear_scan`, `lti_scan`) against
`sequential_scan` — values and gradients — in float64, for lengths that are and are not powers of
two, decays of both signs and above one in magnitude, exact 0 (a reset), exact ±1, complex
decays for `lti_scan`, and two trailing state dimensions; the gradients of broadcast decays; and
the form Dynamo traces, bitwise the eager one.

Tolerances are first-order rounding bounds, not guesses. Every computation here is a sum of
products; a computed sum differs from the exact one by at most n·δ·Σ|terms|, with n the number of
operations on a term's path and δ = 2·eps ≥ the relative error of one real operation (eps/2) or
complex product (√5·eps/2). Σ|terms| is the same computation on |a|, |b| (and |weights|): the
"envelope", computed with `sequential_scan`, so the bound holds elementwise even where decays of
magnitude above one make states large. A term of h_t passes through ≤ 2T operations in the loop
and ≤ T - 1 decay products plus ceil(log2 T) multiply-adds in a scan: n = 4T for the difference
(since 2·ceil(log2 T) ≤ T + 1). A gradient term is a product of ≤ T + 1 factors summed over time
twice (the state and the adjoint) and over time and batch once more: ≤ 5T + 2 operations in each
computation, n = 10T + 4 for the difference.
"""
from __future__ import annotations

import math

import pytest
import torch

from models.scan import linear_scan, lti_scan, sequential_scan

EPS = torch.finfo(torch.float64).eps
OP_ERROR = 2 * EPS
LENGTHS = [1, 2, 5, 64, 100]  # 5 and 100 are not powers of two: the last doubling step is ragged
BATCH, STATE = 2, (4, 3)


def time_varying_decay(length: int, generator: torch.Generator) -> torch.Tensor:
    """(B, T, 4, 3): standard normal (both signs, |a| > 1 about a third of the time), with an
    exact 0 every 7th step in one entry, and entries fixed at exactly 1 and -1."""
    decay = torch.randn(BATCH, length, *STATE, generator=generator, dtype=torch.float64)
    decay[:, ::7, 0, 0] = 0.0
    decay[:, :, 0, 1] = 1.0
    decay[:, :, 1, 0] = -1.0
    return decay


def constant_decay(kind: str, generator: torch.Generator) -> torch.Tensor:
    """(4, 3), real or complex, with entries exactly 0, 1 and -1; the others have moduli up to
    1.1 (T = 100 steps then scale a state by up to 1.1^99 ≈ 1e4) and, if complex, any phase."""
    modulus = 1.1 * torch.rand(*STATE, generator=generator, dtype=torch.float64)
    if kind == "real":
        sign = torch.randint(0, 2, STATE, generator=generator).to(torch.float64) * 2 - 1
        decay = sign * modulus
    else:
        phase = 2 * math.pi * torch.rand(*STATE, generator=generator, dtype=torch.float64)
        decay = torch.polar(modulus, phase)
    decay[0, 0], decay[0, 1], decay[1, 0] = 0.0, 1.0, -1.0
    return decay


def random_drive(length: int, complex_valued: bool, generator: torch.Generator) -> torch.Tensor:
    drive = torch.randn(BATCH, length, *STATE, generator=generator, dtype=torch.float64)
    if complex_valued:
        drive = torch.complex(drive, torch.randn(drive.shape, generator=generator,
                                                 dtype=torch.float64))
    return drive


def envelope(decay: torch.Tensor, drive: torch.Tensor) -> torch.Tensor:
    """Σ_s |Π a_r| |b_s| per state: the sum of the terms' magnitudes."""
    return sequential_scan(decay.abs(), drive.abs())[0]


def assert_within(actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> None:
    error = (actual - expected).abs()
    worst = (error - bound).argmax()
    assert bool((error <= bound).all()), (
        f"error {error.flatten()[worst].item():.3e} > bound {bound.flatten()[worst].item():.3e}")


def closed_form(decay: torch.Tensor, drive: torch.Tensor) -> torch.Tensor:
    """h_t = Σ_{s≤t} (Π_{s<r≤t} a_r) b_s term by term (an empty product is 1)."""
    length = drive.shape[1]
    decays = decay if decay.dim() == drive.dim() else decay.expand_as(drive)
    states = []
    for t in range(length):
        states.append(sum(decays[:, s + 1:t + 1].prod(dim=1) * drive[:, s] for s in range(t + 1)))
    return torch.stack(states, dim=1)


@pytest.mark.parametrize("length", [1, 2, 5, 13])
@pytest.mark.parametrize("kind", ["time-varying", "real", "complex"])
def test_sequential_scan_is_the_closed_form(length, kind):
    generator = torch.Generator().manual_seed(length)
    if kind == "time-varying":
        decay = time_varying_decay(length, generator)
    else:
        decay = constant_decay(kind, generator)
    drive = random_drive(length, kind == "complex", generator)
    states, last = sequential_scan(decay, drive)
    assert_within(states, closed_form(decay, drive),
                  4 * length * OP_ERROR * envelope(decay, drive))
    assert torch.equal(last, states[:, -1])


@pytest.mark.parametrize("kind", ["time-varying", "complex"])
def test_sequential_scan_continues_from_a_carried_state(kind):
    """Scanning the first part, then the rest from its last state, is scanning the whole: the
    same operations in the same order, so the results are identical."""
    generator = torch.Generator().manual_seed(1)
    decay = (time_varying_decay(11, generator) if kind == "time-varying"
             else constant_decay(kind, generator))
    drive = random_drive(11, kind == "complex", generator)
    whole, whole_last = sequential_scan(decay, drive)
    head, head_last = sequential_scan(decay[:, :4] if kind == "time-varying" else decay,
                                      drive[:, :4])
    tail, tail_last = sequential_scan(decay[:, 4:] if kind == "time-varying" else decay,
                                      drive[:, 4:], head_last)
    assert torch.equal(torch.cat([head, tail], dim=1), whole)
    assert torch.equal(tail_last, whole_last)


def test_constant_decay_is_a_time_varying_decay_repeated():
    """A decay with one dimension fewer than drive is constant; repeating it over (B, T) gives
    the same states, in sequential_scan and across the two parallel scans. (Broadcast and
    repeated operands may take different vectorised kernels, hence a rounding bound.)"""
    generator = torch.Generator().manual_seed(2)
    decay = constant_decay("complex", generator)
    drive = random_drive(9, True, generator)
    repeated = decay.expand_as(drive)
    bound = 4 * 9 * OP_ERROR * envelope(decay, drive)
    assert_within(sequential_scan(decay, drive)[0], sequential_scan(repeated, drive)[0], bound)
    assert_within(lti_scan(decay, drive), linear_scan(repeated, drive), bound)


def test_lti_decay_broadcasts_against_one_time_step():
    """A decay shared along a state dimension ((3,) against states (4, 3)) is the same as that
    decay written out over the dimension."""
    generator = torch.Generator().manual_seed(3)
    decay = constant_decay("complex", generator)[2]  # (3,)
    drive = random_drive(37, True, generator)
    assert_within(lti_scan(decay, drive), lti_scan(decay.expand(STATE), drive),
                  4 * 37 * OP_ERROR * envelope(decay, drive))


@pytest.mark.parametrize("length", LENGTHS)
def test_linear_scan_equals_sequential_scan(length):
    generator = torch.Generator().manual_seed(10 + length)
    decay = time_varying_decay(length, generator)
    drive = random_drive(length, False, generator)
    assert_within(linear_scan(decay, drive), sequential_scan(decay, drive)[0],
                  4 * length * OP_ERROR * envelope(decay, drive))


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("kind", ["real", "complex"])
def test_lti_scan_equals_sequential_scan(length, kind):
    generator = torch.Generator().manual_seed(20 + length)
    decay = constant_decay(kind, generator)
    drive = random_drive(length, kind == "complex", generator)
    assert_within(lti_scan(decay, drive), sequential_scan(decay, drive)[0],
                  4 * length * OP_ERROR * envelope(decay, drive))


def gradients(scan, decay: torch.Tensor, drive: torch.Tensor, weights: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """∂/∂(decay, drive) of Σ Re(conj(w) ⊙ h): every state and time step weighted at random."""
    decay, drive = decay.detach().requires_grad_(), drive.detach().requires_grad_()
    loss = (weights.conj() * scan(decay, drive)).real.sum()
    # With T = 1 the parallel scans never touch the decay: its gradient is zero, not missing.
    return torch.autograd.grad(loss, (decay, drive), allow_unused=True, materialize_grads=True)


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("kind", ["time-varying", "real", "complex"])
def test_gradients_equal_sequential_scan_gradients(length, kind):
    generator = torch.Generator().manual_seed(30 + length)
    if kind == "time-varying":
        decay, scan = time_varying_decay(length, generator), linear_scan
    else:
        decay, scan = constant_decay(kind, generator), lti_scan
    drive = random_drive(length, kind == "complex", generator)
    weights = random_drive(length, kind == "complex", generator)
    parallel = gradients(scan, decay, drive, weights)
    sequential = gradients(lambda a, b: sequential_scan(a, b)[0], decay, drive, weights)
    # The same gradients of the all-positive problem are the sums of the terms' magnitudes.
    envelopes = gradients(lambda a, b: sequential_scan(a, b)[0], decay.abs(), drive.abs(),
                          weights.abs())
    for p, s, e in zip(parallel, sequential, envelopes):
        assert_within(p, s, (10 * length + 4) * OP_ERROR * e)


@pytest.mark.parametrize("kind", ["time-varying", "broadcast", "real", "complex"])
def test_gradients_through_broadcast_decays_equal_sequential_scan_gradients(kind):
    """A decay expanded along the batch and time (the non-selective SSM's) or broadcast along
    a state dimension (lti_scan's (3,) against (4, 3)) gets the gradient of the decay it
    broadcasts, summed over where it was repeated."""
    generator = torch.Generator().manual_seed(40)
    drive = random_drive(23, kind == "complex", generator)
    weights = random_drive(23, kind == "complex", generator)
    if kind in ("time-varying", "broadcast"):
        base = time_varying_decay(1, generator)[:1, :1]
        scan, decay = linear_scan, base if kind == "broadcast" else time_varying_decay(23, generator)
        expand = (lambda a: a.expand_as(drive)) if kind == "broadcast" else (lambda a: a)
    else:
        scan, decay, expand = lti_scan, constant_decay(kind, generator)[2], lambda a: a
    parallel = gradients(lambda a, b: scan(expand(a), b), decay, drive, weights)
    sequential = gradients(lambda a, b: sequential_scan(expand(a), b)[0], decay, drive, weights)
    envelopes = gradients(lambda a, b: sequential_scan(expand(a), b)[0], decay.abs(),
                          drive.abs(), weights.abs())
    for p, s, e in zip(parallel, sequential, envelopes):
        assert p.shape == s.shape
        assert_within(p, s, (10 * 23 + 4) * OP_ERROR * e)


@pytest.mark.parametrize("length", [1, 2, 7, 64])
@pytest.mark.parametrize("scan", ["linear", "lti"])
def test_the_traced_form_is_bitwise_the_eager_one(length, scan, monkeypatch):
    """Under torch.compile the doubling steps are written with cat (Dynamo refuses writes into
    a view through out=): the same two roundings a step, so the states and gradients are
    bitwise those of the eager steps, which write into reused buffers."""
    generator = torch.Generator().manual_seed(50 + length)
    drive = torch.randn(3, length, 4, 5, generator=generator)
    decay = (torch.rand(3, length, 4, 5, generator=generator) if scan == "linear"
             else torch.rand(4, 5, generator=generator))
    weights = torch.randn(drive.shape, generator=generator)
    function = linear_scan if scan == "linear" else lti_scan

    def states_and_gradients():
        leaves = decay.clone().requires_grad_(), drive.clone().requires_grad_()
        states = function(*leaves)
        return (states.detach(), *torch.autograd.grad((states * weights).sum(), leaves))

    eager = states_and_gradients()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    traced = states_and_gradients()
    for a, b in zip(eager, traced):
        assert torch.equal(a, b)
