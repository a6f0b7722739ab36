"""bench/training/cross_entropy.py against torch's cross_entropy (its definition), and the memory
it exists to save."""
import pytest
import torch
import torch.nn.functional as F

from bench.training.cross_entropy import CHUNK_ELEMENTS, chunked_cross_entropy, uses_chunks
from bench.training.memory import Allocations


def logits_and_targets(rows: int, vocab: int, dtype=torch.float32, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(rows, vocab, generator=generator)).to(dtype).requires_grad_()
    targets = torch.randint(vocab, (rows,), generator=generator)
    return logits, targets


@pytest.mark.parametrize("chunk_elements", [7 * 50, 50, 1, CHUNK_ELEMENTS])
def test_loss_and_gradient_equal_torchs_to_float32_rounding(chunk_elements):
    """Chunks of 7 rows, of 1 row, of less than a row, and one chunk: per-row losses and the
    gradient of a weighted sum (each row its own incoming gradient) as torch's."""
    logits, targets = logits_and_targets(37, 50)
    weights = torch.rand(37, generator=torch.Generator().manual_seed(1))
    loss = chunked_cross_entropy(logits, targets, chunk_elements)
    (grad,) = torch.autograd.grad((loss * weights).sum(), logits)
    expected = F.cross_entropy(logits, targets, reduction="none")
    (expected_grad,) = torch.autograd.grad((expected * weights).sum(), logits)
    torch.testing.assert_close(loss, expected, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(grad, expected_grad, rtol=2e-6, atol=1e-7)


def test_bf16_logits_are_scored_in_float32_and_get_a_bf16_gradient():
    """The loss of bf16 logits is torch's loss of their float32 values; the gradient comes back
    in bf16, the float32 gradient rounded."""
    logits, targets = logits_and_targets(64, 300, torch.bfloat16)
    loss = chunked_cross_entropy(logits, targets, 300 * 5)
    assert loss.dtype == torch.float32
    (grad,) = torch.autograd.grad(loss.mean(), logits)
    exact = logits.detach().float().requires_grad_()
    expected = F.cross_entropy(exact, targets, reduction="none")
    (expected_grad,) = torch.autograd.grad(expected.mean(), exact)
    torch.testing.assert_close(loss, expected, rtol=2e-6, atol=2e-6)
    assert grad.dtype == torch.bfloat16
    torch.testing.assert_close(grad.float(), expected_grad, rtol=1e-2, atol=1e-5)


def test_which_logits_take_chunks():
    """Half-precision logits and more than a chunk of float32 ones; small float32 logits (the
    synthetic token tasks) keep torch's loss."""
    assert not uses_chunks(torch.empty(8192, 2))
    assert uses_chunks(torch.empty(4, 3, dtype=torch.bfloat16))
    assert uses_chunks(torch.empty(4, 3, dtype=torch.float16))
    assert uses_chunks(torch.empty(CHUNK_ELEMENTS + 1, device="meta"))


def peak_bytes(loss_of, logits, targets) -> int:
    with Allocations() as allocated:
        loss_of(logits, targets).mean().backward()
    return allocated.peak


def test_bf16_logits_cost_no_float32_copy():
    """A loss and backward of 4096 bf16 rows of 2,048 logits (16 MiB): torch's allocates a
    float32 copy and its float32 log-softmax (64 MiB); the chunked one (chunks of 2^18) its
    bf16 gradient and about a chunk."""
    logits, targets = logits_and_targets(4096, 2048, torch.bfloat16)
    torchs = peak_bytes(lambda x, t: F.cross_entropy(x.float(), t, reduction="none"),
                        logits, targets)
    chunked = peak_bytes(lambda x, t: chunked_cross_entropy(x, t, 1 << 18), logits, targets)
    size = logits.numel() * logits.element_size()
    assert torchs >= 4 * size
    assert chunked < 1.5 * size, (chunked, size)
