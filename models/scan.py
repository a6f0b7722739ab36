"""Scans of the diagonal linear recurrence h_t = a_t ⊙ h_{t-1} + b_t (h_{-1} = 0), shared by the
recurrent cores (GD-SSM, LRU, Griffin's RG-LRU, the selective SSM).

Tensors are (B, T, ...): batch, time, then any state shape. The parallel scans are Hillis-Steele
doubling scans: ceil(log2 T) steps, each one element-wise operation over the whole sequence.
They form only products (or powers) of decays, never quotients or logarithms, so decays of any
sign, exact zeros (a reset) and magnitudes above one are handled exactly as the loop handles
them. `sequential_scan` is the step-by-step twin: the test oracle, and the form that continues
from a carried state.
"""
from __future__ import annotations

import torch
from torch import Tensor


def linear_scan(decay: Tensor, drive: Tensor) -> Tensor:
    """All states h_t = decay_t ⊙ h_{t-1} + drive_t at once; decay has drive's shape (B, T, ...).

    The pairs (a, b) compose associatively, (a₁, b₁) then (a₂, b₂) = (a₂a₁, a₂b₁ + b₂). Before
    the step with offset k, position t holds the composition of its last min(t+1, k) pairs: the
    sum of those drives, each weighted by the product of the decays after it, and the product of
    those decays. Composing with the pair k steps back doubles both spans."""
    length = drive.shape[1]
    offset = 1
    while offset < length:
        drive = torch.cat([drive[:, :offset],
                           drive[:, offset:] + decay[:, offset:] * drive[:, :-offset]], dim=1)
        decay = torch.cat([decay[:, :offset], decay[:, offset:] * decay[:, :-offset]], dim=1)
        offset *= 2
    return drive


def lti_scan(decay: Tensor, drive: Tensor) -> Tensor:
    """All states h_t = decay ⊙ h_{t-1} + drive_t at once for a constant decay, broadcast
    against drive[:, 0] (real or complex).

    The product of any k consecutive decays is decay^k, so only the powers decay^(2^j) are kept
    (one squaring per step) instead of a (B, T, ...) tensor of running products: before the step
    with offset k, h_t sums its last min(t+1, k) drives, and adding decay^k times the value k
    steps back doubles that span."""
    length = drive.shape[1]
    offset, power = 1, decay
    while offset < length:
        drive = torch.cat([drive[:, :offset], drive[:, offset:] + power * drive[:, :-offset]],
                          dim=1)
        power = power * power
        offset *= 2
    return drive


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
