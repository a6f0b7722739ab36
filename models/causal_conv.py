"""The causal depthwise convolution of Mamba-2, Griffin and the transformer's q/k/v convolution,
on (B, T, C) tensors:

    y_t = bias + Σ_k w_k ⊙ x_{t-K+1+k}        (x before the start is zero)

The forward pass is the module's own (nn.Conv1d padded by K - 1 on both sides, cut to the first T
outputs), so the outputs are bitwise what the module computes. The backward pass is its own:
autograd's convolution backward, a general kernel, took 2.8 ms of the default 30 ms CPU step
(a width-4 filter over 64 channels), where the filter's gradient as K shifted products and the
input's as a forward convolution take about 0.9 ms. The gradients equal autograd's up to
rounding (tests/test_causal_conv.py holds them to it in float64).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable


def causal_conv1d(x: Tensor, conv: nn.Conv1d) -> Tensor:
    """conv (depthwise, its padding K - 1) applied causally along the time axis of x (B, T, C):
    (B, T, C), contiguous."""
    return _CausalConv.apply(x, conv.weight, conv.bias)


class _CausalConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        width = weight.shape[-1]
        y = F.conv1d(x.transpose(1, 2), weight, bias, padding=width - 1, groups=x.shape[-1])
        return y[..., :x.shape[1]].transpose(1, 2).contiguous()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x, weight = ctx.saved_tensors
        length, width = x.shape[1], weight.shape[-1]
        # Tap k multiplies x `shift` = K-1-k steps back; a shift past the sequence reads zeros.
        shifts = [(k, width - 1 - k) for k in range(width) if width - 1 - k < length]
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            # ∂L/∂x_s = Σ_k w_k ∂L/∂y_{s+K-1-k}: the forward convolution, of the gradient padded
            # after its end, with the filter reversed (faster than K shifted products here)
            reversed_filter = weight.flip(-1).to(grad.dtype)
            grad_x = F.conv1d(F.pad(grad.transpose(1, 2), (0, width - 1)), reversed_filter,
                              groups=grad.shape[-1]).transpose(1, 2).to(x.dtype)
        if ctx.needs_input_grad[1]:
            # in the filter's dtype: under bf16 autocast x and grad are bf16, and each tap sums
            # B·T products
            grad_weight = weight.new_zeros(weight.shape)
            grad_in, x_in = grad.to(weight.dtype), x.to(weight.dtype)
            for k, shift in shifts:
                grad_weight[:, 0, k] = (grad_in[:, shift:] * x_in[:, :length - shift]).sum((0, 1))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.to(weight.dtype).sum((0, 1))
        return grad_x, grad_weight, grad_bias
