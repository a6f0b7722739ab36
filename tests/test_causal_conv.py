"""models/causal_conv.py: the causal depthwise convolution's outputs are bitwise the module's, and
its own backward pass gives autograd's gradients (float64, to rounding), for sequences shorter
than the filter too, with and without a bias, and under bf16 autocast in the parameters' dtype."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from models.causal_conv import causal_conv1d


def module_path(x: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """What the models computed before: the module on (B, C, T), cut to the first T outputs."""
    return conv(x.transpose(1, 2))[..., :x.shape[1]].transpose(1, 2)


def conv_and_input(length: int, width: int, bias: bool, dtype=torch.float32):
    generator = torch.Generator().manual_seed(length * 10 + width)
    channels = 6
    conv = nn.Conv1d(channels, channels, width, groups=channels, padding=width - 1, bias=bias)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=generator))
        if bias:
            conv.bias.copy_(torch.randn(channels, generator=generator))
    x = torch.randn(3, length, channels, generator=generator)
    return conv.to(dtype), x.to(dtype)


@pytest.mark.parametrize("length", [1, 2, 3, 17])
@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize("bias", [True, False])
def test_outputs_are_the_modules_and_gradients_autograds(length, width, bias):
    conv, x = conv_and_input(length, width, bias)
    assert torch.equal(causal_conv1d(x, conv), module_path(x, conv))

    conv, x = conv_and_input(length, width, bias, torch.float64)
    weights = torch.randn(3, length, 6, dtype=torch.float64)
    leaves = [x.requires_grad_(), *conv.parameters()]
    ours = torch.autograd.grad((causal_conv1d(x, conv) * weights).sum(), leaves)
    autograds = torch.autograd.grad((module_path(x, conv) * weights).sum(), leaves)
    for a, b in zip(ours, autograds):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_under_bf16_autocast_the_gradients_come_in_the_parameters_dtype():
    conv, x = conv_and_input(9, 4, True)
    x.requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = causal_conv1d(x, conv)
        reference = module_path(x, conv)
    assert y.dtype == reference.dtype == torch.bfloat16
    assert torch.equal(y, reference)
    y.float().sum().backward()
    assert x.grad.dtype == conv.weight.grad.dtype == conv.bias.grad.dtype == torch.float32
    expected = torch.autograd.grad(F.conv1d(x.detach().transpose(1, 2), conv.weight, conv.bias,
                                            padding=3, groups=6)[..., :9].sum(), conv.weight)[0]
    torch.testing.assert_close(conv.weight.grad, expected, rtol=2e-2, atol=2e-2)
