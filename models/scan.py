"""Scans of the diagonal linear recurrence h_t = a_t ⊙ h_{t-1} + b_t (h_{-1} = 0), shared by the
recurrent cores (GD-SSM, LRU, Griffin's RG-LRU, the selective SSM).

Tensors are (B, T, ...): batch, time, then any state shape. The parallel scans are Hillis-Steele
doubling scans: ceil(log2 T) steps, each one element-wise operation over the whole sequence.
They form only products (or powers) of decays, never quotients or logarithms, so decays of any
sign, exact zeros (a reset) and magnitudes above one are handled exactly as the loop handles
them. `sequential_scan` is the step-by-step twin: the test oracle, and the form that continues
from a carried state.

The parallel scans have their own backward pass. Autograd through the doubling steps would
store and replay every step's slices (a slice's backward writes a zero tensor of the whole
sequence, then adds into it: a third of a GD-SSM or selective-SSM training step). The gradient
is itself one scan, backwards in time, of the output's gradient: with g_t = ∂L/∂h_t,

    g_t = grad_t + conj(a_{t+1}) g_{t+1},   ∂L/∂b_t = g_t,   ∂L/∂a_t = g_t conj(h_{t-1})

(the conjugates are PyTorch's convention for complex gradients and do nothing to real ones).
The values are those of autograd up to rounding; tests/test_scan.py holds both to the loop's.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable


def linear_scan(decay: Tensor, drive: Tensor) -> Tensor:
    """All states h_t = decay_t ⊙ h_{t-1} + drive_t at once; decay has drive's shape (B, T, ...).

    The pairs (a, b) compose associatively, (a₁, b₁) then (a₂, b₂) = (a₂a₁, a₂b₁ + b₂). Before
    the step with offset k, position t holds the composition of its last min(t+1, k) pairs: the
    sum of those drives, each weighted by the product of the decays after it, and the product of
    those decays. Composing with the pair k steps back doubles both spans."""
    return _Scan.apply(decay, drive, False)


def lti_scan(decay: Tensor, drive: Tensor) -> Tensor:
    """All states h_t = decay ⊙ h_{t-1} + drive_t at once for a constant decay, broadcast
    against drive[:, 0] (real or complex).

    The product of any k consecutive decays is decay^k, so only the powers decay^(2^j) are kept
    (one squaring per step) instead of a (B, T, ...) tensor of running products: before the step
    with offset k, h_t sums its last min(t+1, k) drives, and adding decay^k times the value k
    steps back doubles that span."""
    return _Scan.apply(decay, drive, True)


def _doubling_scan(decay: Tensor, drive: Tensor, reverse: bool = False) -> Tensor:
    """linear_scan's states, without autograd; with `reverse`, those of the recurrence run from
    the end, h_t = decay_t ⊙ h_{t+1} + drive_t, where decay_t is the factor of position t's
    successor (decay_{T-1} is never used)."""
    length = drive.shape[1]
    dtype = torch.promote_types(decay.dtype, drive.dtype)
    states, products = _Buffers(drive, dtype), _Buffers(decay, decay.dtype)
    offset = 1
    while offset < length:
        drive = _shift_add(drive, decay, offset, reverse, states.next())
        if 2 * offset < length:  # the last step's products would not be read
            decay = _shift_mul(decay, offset, reverse, products.next())
        offset *= 2
    return states.result(drive)


def _doubling_lti_scan(decay: Tensor, drive: Tensor, reverse: bool = False) -> Tensor:
    """lti_scan's states, without autograd; with `reverse`, those of h_t = decay ⊙ h_{t+1} +
    drive_t."""
    length = drive.shape[1]
    states = _Buffers(drive, torch.promote_types(decay.dtype, drive.dtype))
    offset, power = 1, decay
    while offset < length:
        drive = _shift_add(drive, power, offset, reverse, states.next())
        power = power * power
        offset *= 2
    return states.result(drive)


class _Buffers:
    """Two tensors of `like`'s shape that a doubling scan's steps write in turn (each step reads
    the other one, or the input, which is never written)."""

    def __init__(self, like: Tensor, dtype: torch.dtype):
        self.like, self.dtype, self.written = like, dtype, 0
        self.tensors: list[Tensor] = []

    def next(self) -> Tensor:
        if len(self.tensors) < 2:
            self.tensors.append(torch.empty(self.like.shape, dtype=self.dtype,
                                            device=self.like.device))
        self.written += 1
        return self.tensors[(self.written - 1) % 2]

    def result(self, last: Tensor) -> Tensor:
        """The last step's output; a copy of the input where no step ran (a sequence of one)."""
        return last if self.written else last.clone()


def _shifted(length: int, offset: int, reverse: bool) -> tuple[slice, slice, slice]:
    """(the positions a step updates, the positions they read, the positions it keeps)."""
    if reverse:
        return slice(None, length - offset), slice(offset, None), slice(length - offset, None)
    return slice(offset, None), slice(None, length - offset), slice(None, offset)


def _shift_add(values: Tensor, factor: Tensor, offset: int, reverse: bool, out: Tensor) -> Tensor:
    """out_t = values_t + factor_t ⊙ values_{t∓offset} where that position exists, else values_t;
    a factor without a time axis (lti_scan's power) is broadcast. The same two roundings as
    `values + factor * shifted`, so the states are bitwise those of the scan written with cat."""
    updated, read, kept = _shifted(values.shape[1], offset, reverse)
    factor = factor[:, updated] if factor.dim() == values.dim() else factor
    if torch.compiler.is_compiling():  # Dynamo refuses out= views; Inductor fuses the cat
        return _joined(values[:, kept], values[:, updated] + factor * values[:, read], reverse)
    out[:, kept] = values[:, kept]
    torch.mul(factor, values[:, read], out=out[:, updated])
    out[:, updated] += values[:, updated]
    return out


def _shift_mul(factor: Tensor, offset: int, reverse: bool, out: Tensor) -> Tensor:
    """out_t = factor_t ⊙ factor_{t∓offset} where that position exists, else factor_t."""
    updated, read, kept = _shifted(factor.shape[1], offset, reverse)
    if torch.compiler.is_compiling():
        return _joined(factor[:, kept], factor[:, updated] * factor[:, read], reverse)
    out[:, kept] = factor[:, kept]
    torch.mul(factor[:, updated], factor[:, read], out=out[:, updated])
    return out


def _joined(kept: Tensor, updated: Tensor, reverse: bool) -> Tensor:
    """The kept positions and the updated ones in time order."""
    return torch.cat([updated, kept] if reverse else [kept, updated], dim=1)


def _decay_gradient(adjoint: Tensor, states: Tensor, decay: Tensor) -> Tensor:
    """∂L/∂a_t = g_t conj(h_{t-1}) (zero at t = 0, where h_{-1} = 0), real for a real decay."""
    gradient = torch.zeros_like(adjoint)
    gradient[:, 1:] = adjoint[:, 1:] * states[:, :-1].conj()
    return gradient if decay.is_complex() or not gradient.is_complex() else gradient.real


class _Scan(torch.autograd.Function):
    """linear_scan, or lti_scan when `constant`, with the backward pass of the module's docstring."""

    @staticmethod
    def forward(ctx, decay: Tensor, drive: Tensor, constant: bool) -> Tensor:
        states = (_doubling_lti_scan if constant else _doubling_scan)(decay, drive)
        ctx.save_for_backward(decay, states)
        ctx.constant = constant
        return states

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor, None]:
        decay, states = ctx.saved_tensors
        if ctx.constant:
            adjoint = _doubling_lti_scan(decay.conj(), grad, reverse=True)
        else:  # the factor of g_{t+1} in g_t is conj(a_{t+1}): the decays moved one step back
            adjoint = _doubling_scan(decay.conj().roll(-1, dims=1), grad, reverse=True)
        decay_grad = None
        if ctx.needs_input_grad[0]:
            decay_grad = _decay_gradient(adjoint, states, decay)
            if ctx.constant:  # one decay for every sequence and step
                decay_grad = decay_grad.sum((0, 1))
            decay_grad = decay_grad.sum_to_size(decay.shape)
        return decay_grad, adjoint, None


def sequential_scan(decay: Tensor, drive: Tensor, state: Tensor | None = None
                    ) -> tuple[Tensor, Tensor]:
    """The recurrence one step at a time from `state` (B, ...) (zeros if None). `decay` is
    time-varying if it has drive's number of dimensions (B, T, ...), otherwise constant and
    broadcast against drive[:, 0] as in `lti_scan`. Returns all states (B, T, ...) and the last
    one (B, ...): T sequential steps, the independent oracle of both parallel scans."""
    time_varying = decay.dim() == drive.dim()
    h = torch.zeros_like(drive[:, 0]) if state is None else state
    states = []
    for t in range(drive.shape[1]):
        h = (decay[:, t] if time_varying else decay) * h + drive[:, t]
        states.append(h)
    return torch.stack(states, dim=1), h
