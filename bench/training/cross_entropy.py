"""Cross-entropy of a language model's logits without a float32 copy of all of them.

torch's cross_entropy of bf16 logits, as the training loss takes it (in float32), first casts
every logit to float32 and then keeps their float32 log-softmax for the backward pass: for the
14.5M presets' 50,304-token vocabulary that is two float32 copies of B·T·V logits beside the
bf16 ones. `chunked_cross_entropy` walks the rows in chunks instead: the forward pass keeps
only each row's log-sum-exp (B·T floats), and the backward pass recomputes each chunk's softmax
from the logits autograd holds anyway, writing the gradient in the logits' dtype. Per row it is
the same arithmetic in float32 (log-sum-exp, then minus the target's logit), so it agrees with
torch's to float32 rounding (tests/test_cross_entropy.py)."""
from __future__ import annotations

import torch
from torch import Tensor

# Logits per chunk: 2^24 float32 are 64 MiB of temporaries, whatever the vocabulary.
CHUNK_ELEMENTS = 1 << 24


def uses_chunks(logits: Tensor) -> bool:
    """Whether the training loss takes `logits` (rows, V) in chunks: when they are in half
    precision (torch's loss would copy them all to float32) or more than one chunk's worth.
    Smaller float32 logits (every synthetic token task) keep torch's own loss, bit for bit."""
    return logits.dtype in (torch.bfloat16, torch.float16) or logits.numel() > CHUNK_ELEMENTS


def chunked_cross_entropy(logits: Tensor, targets: Tensor,
                          chunk_elements: int = CHUNK_ELEMENTS) -> Tensor:
    """Per-row cross-entropy (rows,) in at least float32 of logits (rows, V) and targets
    (rows,) of token ids in [0, V), computed `chunk_elements // V` rows at a time."""
    rows = max(1, chunk_elements // max(1, logits.shape[-1]))
    return _ChunkedCrossEntropy.apply(logits, targets, rows)


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, rows: int) -> Tensor:
        dtype = torch.promote_types(logits.dtype, torch.float32)
        log_sum_exp = torch.empty(len(targets), dtype=dtype, device=logits.device)
        loss = torch.empty_like(log_sum_exp)
        for start in range(0, len(targets), rows):
            part = slice(start, start + rows)
            chunk = logits[part].to(dtype)
            log_sum_exp[part] = torch.logsumexp(chunk, -1)
            loss[part] = log_sum_exp[part] - chunk.gather(-1, targets[part, None])[:, 0]
        ctx.save_for_backward(logits, targets, log_sum_exp)
        ctx.rows = rows
        return loss

    @staticmethod
    def backward(ctx, grad: Tensor):
        logits, targets, log_sum_exp = ctx.saved_tensors
        grad_logits = torch.empty_like(logits)
        for start in range(0, len(targets), ctx.rows):
            part = slice(start, start + ctx.rows)
            # d loss / d logits = softmax - one_hot(target), scaled by the row's incoming gradient
            softmax = (logits[part].to(log_sum_exp.dtype) - log_sum_exp[part, None]).exp_()
            softmax.scatter_add_(-1, targets[part, None],
                                 softmax.new_full((len(softmax), 1), -1.0))
            grad_logits[part] = softmax.mul_(grad[part, None])
        return grad_logits, None, None
