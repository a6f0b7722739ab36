"""The windows a text task trains and evaluates on, read from a split's tokens (a memmap):
random training windows, and evaluation windows that score every target of a split once."""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def training_windows(tokens: np.ndarray, n: int, seq_len: int,
                     generator: torch.Generator) -> Tensor:
    """(n, seq_len + 1) int64 CPU tensor of windows tokens[s : s + seq_len + 1], with starts s
    uniform on [0, len(tokens) - seq_len - 1] drawn from `generator` (on its own device), so the
    caller's (seed, rank, step) generator makes batches reproducible and resumable. Only the
    windows are read from the memmap. inputs = w[:, :-1], targets = w[:, 1:]."""
    high = len(tokens) - seq_len
    if high < 1:
        raise ValueError(f"a split of {len(tokens)} tokens has no window of {seq_len + 1} tokens")
    starts = torch.randint(high, (n,), generator=generator, device=generator.device).cpu().numpy()
    index = starts[:, None] + np.arange(seq_len + 1)
    return torch.from_numpy(np.asarray(tokens[index], dtype=np.int64))


def evaluation_starts(n_tokens: int, seq_len: int, stride: int | None = None,
                      max_windows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(starts, first_scored): the evaluation windows of a split of n_tokens tokens.

    Window i reads tokens[starts[i] : starts[i] + seq_len + 1] and scores its target positions
    p >= first_scored[i]. Windows advance by stride (default seq_len: non-overlapping); the first
    scores all seq_len targets, later ones their last `stride` (strided perplexity). The tail the
    strided windows miss is scored once by a last window that ends at the split's last token
    (so it is full length and scores only the new targets). Every one of the n_tokens - 1
    targets is scored exactly once. A split shorter than seq_len + 1 tokens gives one padded
    window (windows_at masks the padding). max_windows keeps that many windows evenly spaced
    over the split (still no target twice, but no longer all of them)."""
    stride = seq_len if stride is None else stride
    if not 1 <= stride <= seq_len:
        raise ValueError(f"stride must be in [1, seq_len={seq_len}], not {stride}")
    n_targets = n_tokens - 1
    if n_targets < 1:
        raise ValueError(f"a split of {n_tokens} tokens has nothing to predict")
    if n_targets <= seq_len:
        starts, first = np.zeros(1, np.int64), np.zeros(1, np.int64)
    else:
        starts = np.arange(0, n_targets - seq_len + 1, stride, dtype=np.int64)
        first = np.full(len(starts), seq_len - stride, dtype=np.int64)
        first[0] = 0
        covered = int(starts[-1]) + seq_len
        if covered < n_targets:
            tail = n_targets - seq_len
            starts = np.append(starts, tail)
            first = np.append(first, covered - tail)
    if max_windows is not None and max_windows < len(starts):
        keep = np.unique(np.linspace(0, len(starts) - 1, max_windows).round().astype(np.int64))
        starts, first = starts[keep], first[keep]
    return starts, first


def evaluation_window_count(n_tokens: int, seq_len: int, stride: int | None = None,
                            max_windows: int | None = None) -> int:
    """len(evaluation_starts(...)[0]) without building them: the memory estimate counts the
    windows of a split that may not be tokenized yet."""
    stride = seq_len if stride is None else stride
    n_targets = n_tokens - 1
    if n_targets <= seq_len:
        return 1
    count = (n_targets - seq_len) // stride + 1
    if (count - 1) * stride + seq_len < n_targets:  # the tail window
        count += 1
    return count if max_windows is None else min(count, max_windows)


def windows_at(tokens: np.ndarray, starts: np.ndarray, first_scored: np.ndarray,
               seq_len: int) -> tuple[Tensor, Tensor, Tensor]:
    """(inputs, targets, loss_mask), each (len(starts), seq_len), for the given windows;
    positions past the split's end are padded with 0 and unscored."""
    n_tokens = len(tokens)
    starts = np.asarray(starts, dtype=np.int64)
    index = starts[:, None] + np.arange(seq_len + 1)
    valid = index < n_tokens
    window = np.where(valid, np.asarray(tokens[np.minimum(index, n_tokens - 1)], dtype=np.int64), 0)
    position = np.arange(seq_len)
    mask = (position >= np.asarray(first_scored)[:, None]) & valid[:, 1:]
    window = torch.from_numpy(window)
    return window[:, :-1].contiguous(), window[:, 1:].contiguous(), torch.from_numpy(mask)


def evaluation_windows(tokens: np.ndarray, seq_len: int, stride: int | None = None,
                       max_windows: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(inputs, targets, loss_mask) of all evaluation windows (see evaluation_starts); for a
    large split build them batch by batch with evaluation_starts + windows_at instead."""
    starts, first = evaluation_starts(len(tokens), seq_len, stride, max_windows)
    return windows_at(tokens, starts, first, seq_len)
