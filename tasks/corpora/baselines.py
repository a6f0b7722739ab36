"""Baselines: n-gram models fit on the training split. nll() returns per-position negative
log-likelihoods (float64, 0 where loss_mask is False), never (B, T, V) distributions."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


def _as_numpy(x) -> np.ndarray:
    if isinstance(x, Tensor):
        return x.detach().cpu().numpy().astype(np.int64, copy=False)
    return np.asarray(x, dtype=np.int64)


def _masked(nll: np.ndarray, loss_mask) -> Tensor:
    out = torch.from_numpy(nll)
    if loss_mask is not None:
        out = out.masked_fill(~torch.as_tensor(loss_mask, dtype=torch.bool).cpu(), 0.0)
    return out


@dataclass
class UnigramModel:
    """p(w) = (c(w) + δ) / (N + δV): add-δ smoothed training-split frequencies (δ = 1 is
    add-one); every token, seen or not, has positive probability."""

    counts: np.ndarray  # (V,) int64
    delta: float = 1.0
    name: str = "unigram"

    def __post_init__(self):
        total = self.counts.sum() + self.delta * len(self.counts)
        self.log_p = np.log((self.counts + self.delta) / total)

    @property
    def description(self) -> str:
        return f"unigram frequencies of the training split, add-{self.delta:g} smoothing"

    def probs(self) -> np.ndarray:
        return np.exp(self.log_p)

    def nll(self, inputs, targets, loss_mask=None) -> Tensor:
        return _masked(-self.log_p[_as_numpy(targets)], loss_mask)


def fit_unigram(tokens: np.ndarray, vocab_size: int, delta: float = 1.0,
                chunk: int = 1 << 22) -> UnigramModel:
    """Token counts of the split, read in chunks of the memmap."""
    if delta <= 0:
        raise ValueError("the unigram smoothing delta must be > 0")
    counts = np.zeros(vocab_size, dtype=np.int64)
    for begin in range(0, len(tokens), chunk):
        counts += np.bincount(np.asarray(tokens[begin:begin + chunk]), minlength=vocab_size)
    return UnigramModel(counts, delta)


@dataclass
class BigramModel:
    """Interpolated absolute discounting (Ney, Essen & Kneser 1994):

        p(w | v) = max(c(v, w) − D, 0) / c(v) + D · n(v) / c(v) · p_uni(w),

    c(v, w) the training-split count of the pair, c(v) = Σ_w c(v, w), n(v) the number of distinct
    w seen after v, p_uni the add-δ unigram; p(w | v) = p_uni(w) when v never precedes a token.
    With 0 < D ≤ 1 it sums to 1 over w. Pair counts are sparse: sorted int64 keys v·V + w."""

    keys: np.ndarray  # sorted unique v * V + w
    counts: np.ndarray  # c(v, w) for each key
    vocab_size: int
    unigram: UnigramModel
    discount: float = 0.75
    name: str = "bigram"

    def __post_init__(self):
        prev = self.keys // self.vocab_size
        self.context_count = np.bincount(prev, weights=self.counts, minlength=self.vocab_size)
        self.distinct = np.bincount(prev, minlength=self.vocab_size)

    @property
    def description(self) -> str:
        return (f"bigram of the training split, interpolated absolute discounting "
                f"D={self.discount:g} with the add-{self.unigram.delta:g} unigram")

    def pair_counts(self, prev: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        key = prev * self.vocab_size + nxt
        at = np.searchsorted(self.keys, key)
        at_ok = np.minimum(at, len(self.keys) - 1)
        found = (at < len(self.keys)) & (self.keys[at_ok] == key) if len(self.keys) else \
            np.zeros(key.shape, bool)
        return np.where(found, self.counts[at_ok] if len(self.keys) else 0, 0)

    def _prob(self, prev: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        c_vw = self.pair_counts(prev, nxt)
        c_v = self.context_count[prev]
        seen = c_v > 0
        safe = np.where(seen, c_v, 1.0)
        p_uni = np.exp(self.unigram.log_p[nxt])
        p = np.maximum(c_vw - self.discount, 0) / safe + \
            self.discount * self.distinct[prev] / safe * p_uni
        return np.where(seen, p, p_uni)

    def probs(self, prev: int) -> np.ndarray:
        """The full next-token distribution after token prev (V,)."""
        return self._prob(np.full(self.vocab_size, prev, np.int64), np.arange(self.vocab_size))

    def nll(self, inputs, targets, loss_mask=None) -> Tensor:
        return _masked(-np.log(self._prob(_as_numpy(inputs), _as_numpy(targets))), loss_mask)


def _merge_counts(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sum counts of equal keys; keys come out sorted and unique."""
    order = np.argsort(keys, kind="stable")  # timsort: linear on concatenated sorted runs
    keys, counts = keys[order], counts[order]
    if len(keys) == 0:
        return keys, counts
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    return keys[starts], np.add.reduceat(counts, starts)


def fit_bigram(tokens: np.ndarray, vocab_size: int, discount: float = 0.75,
               unigram: UnigramModel | None = None, chunk: int = 1 << 22) -> BigramModel:
    """Pair counts of consecutive tokens, read in chunks of the memmap (each chunk's pairs
    counted with np.unique and merged into the running sorted counts): memory grows with the
    number of distinct pairs, never V²."""
    if not 0 < discount <= 1:
        raise ValueError("the bigram discount D must be in (0, 1]")
    unigram = unigram or fit_unigram(tokens, vocab_size)
    keys = np.zeros(0, np.int64)
    counts = np.zeros(0, np.int64)
    for begin in range(0, len(tokens) - 1, chunk):
        piece = np.asarray(tokens[begin:begin + chunk + 1], dtype=np.int64)
        chunk_keys, chunk_counts = np.unique(piece[:-1] * vocab_size + piece[1:],
                                             return_counts=True)
        keys, counts = _merge_counts(np.concatenate([keys, chunk_keys]),
                                     np.concatenate([counts, chunk_counts.astype(np.int64)]))
    return BigramModel(keys, counts, vocab_size, unigram, discount)


@dataclass
class CacheModel:
    """An in-context unigram cache (Kuhn & De Mori 1990): at position t of a window,

        p(w) = (1 − λ) · p_uni(w) + λ · n_t(w) / (t + 1),

    n_t(w) the number of times w occurs in inputs[0..t] of the same window (everything the model
    has seen when predicting targets[t]); causal, and positive wherever p_uni is."""

    unigram: UnigramModel
    lam: float = 0.1
    name: str = "unigram_cache"

    def __post_init__(self):
        if not 0 <= self.lam < 1:
            raise ValueError("the cache weight lambda must be in [0, 1)")

    @property
    def description(self) -> str:
        return (f"in-context unigram cache: {1 - self.lam:g} x training unigram + {self.lam:g} x "
                f"frequencies of the tokens seen so far in the window")

    def probs(self, context) -> np.ndarray:
        """The full next-token distribution after the window's inputs `context` (1-D)."""
        context = _as_numpy(context)
        seen = np.bincount(context, minlength=len(self.unigram.counts)) / len(context)
        return (1 - self.lam) * self.unigram.probs() + self.lam * seen

    def nll(self, inputs, targets, loss_mask=None) -> Tensor:
        inputs, targets = _as_numpy(inputs), _as_numpy(targets)
        seen = occurrences_so_far(inputs, targets)
        length = np.arange(1, inputs.shape[-1] + 1)
        p = (1 - self.lam) * np.exp(self.unigram.log_p[targets]) + self.lam * seen / length
        return _masked(-np.log(p), loss_mask)


def occurrences_so_far(inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """n[b, t] = #{s ≤ t : inputs[b, s] == targets[b, t]} in O(B·T log(B·T)): inputs and targets
    become events sorted by (row, value, time, inputs before targets at equal time); a target's
    count is the number of input events before it in its (row, value) group."""
    rows, length = inputs.shape
    if rows == 0 or length == 0:
        return np.zeros(inputs.shape, np.int64)
    row = np.repeat(np.arange(rows), length)
    t = np.tile(np.arange(length), rows)
    values = np.concatenate([inputs.ravel(), targets.ravel()])
    groups = np.concatenate([row, row]) * (values.max() + 1) + values
    times = np.concatenate([2 * t, 2 * t + 1])  # an input at time t precedes the target at t
    order = np.lexsort((times, groups))
    is_input = (np.arange(2 * rows * length) < rows * length)[order]
    before = np.cumsum(is_input) - is_input  # input events strictly before, over all groups
    g = groups[order]
    group_start = np.r_[True, g[1:] != g[:-1]]
    start_index = np.maximum.accumulate(np.where(group_start, np.arange(len(g)), 0))
    count = before - before[start_index]
    out = np.empty(2 * rows * length, np.int64)
    out[order] = count
    return out[rows * length:].reshape(rows, length)


def fit_baselines(tokens: np.ndarray, vocab_size: int, *, delta: float = 1.0,
                  discount: float = 0.75, cache_lambda: float = 0.1
                  ) -> dict[str, UnigramModel | BigramModel | CacheModel]:
    """{name: model} of the three baselines fit on the training split's tokens."""
    unigram = fit_unigram(tokens, vocab_size, delta)
    return {"unigram": unigram, "bigram": fit_bigram(tokens, vocab_size, discount, unigram),
            "unigram_cache": CacheModel(unigram, cache_lambda)}
