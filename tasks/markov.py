"""Random Markov chains of order k (paper 000 §2.1) and the add-β (Laplacian smoothing) oracle.

Each sequence gets its own kernel: every one of the S^k context rows is drawn from Dir(β·1). The
first k tokens are uniform; token t+1 ~ P[x_{t-k+1..t}] afterwards. The Bayes-optimal next-token
predictor under this prior is the add-β estimator (n_j + β) / (n + Sβ), with n_j the number of
times j followed the current context so far (paper 000 §2.4); for positions before the first
full context it is uniform.

Training tasks (`num_tasks`, as in paper 004's finite-task experiments): N > 0 trains on a pool
of N kernels drawn once from the run seed (tasks/base.py `task_pool`), each training sequence
following one picked uniformly; the held-out set still draws a fresh kernel per sequence.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from tasks.base import Batch, Reference, Task
from tasks.distributions import dirichlet, inverse_cdf


@dataclass
class MarkovConfig:
    order: int = 1  # k
    vocab_size: int = 2  # S
    beta: float = 1.0  # Dirichlet concentration of each kernel row
    seq_len: int = 256  # scored positions T (T + 1 tokens are sampled)
    num_tasks: int = 0  # training kernels: a pool of this many drawn once; 0: fresh per sequence

    def __post_init__(self):
        if self.order < 1 or self.vocab_size < 2 or self.beta <= 0 or self.seq_len < 1:
            raise ValueError("markov needs order >= 1, vocab_size >= 2, beta > 0, seq_len >= 1")
        if self.num_tasks < 0:
            raise ValueError(f"markov needs num_tasks >= 0 (0: a fresh kernel per training "
                             f"sequence), got {self.num_tasks}")


def context_ids(tokens: Tensor, order: int, vocab_size: int) -> Tensor:
    """Index in [0, S^k) of the context x_{t-k+1..t} ending at each position (base-S digits,
    most recent token least significant); positions t < k-1 get S^k (no full context yet)."""
    ids = torch.zeros_like(tokens)
    for lag in range(order):
        shifted = torch.nn.functional.pad(tokens, (lag, 0))[:, : tokens.shape[1]]
        ids = ids + shifted * vocab_size**lag
    ids[:, : order - 1] = vocab_size**order
    return ids


def counts_in_context(groups: Tensor, targets: Tensor, vocab_size: int) -> Tensor:
    """n[b, t, j] = #{s < t : groups[b, s] == groups[b, t] and targets[b, s] == j}.

    Fully vectorised: a stable sort brings each group's positions together in time order, an
    exclusive cumulative sum counts what came before, and the count at the group's first
    element is subtracted. Memory O(B·T·S) whatever the number of groups."""
    batch, length = groups.shape
    time = torch.arange(length, device=groups.device)
    order = torch.argsort(groups * length + time, dim=1)
    sorted_groups = groups.gather(1, order)
    onehot = torch.nn.functional.one_hot(targets.gather(1, order), vocab_size).double()
    before = onehot.cumsum(1) - onehot
    is_start = torch.ones_like(sorted_groups, dtype=torch.bool)
    is_start[:, 1:] = sorted_groups[:, 1:] != sorted_groups[:, :-1]
    start = torch.where(is_start, time, torch.zeros_like(time)).cummax(1).values
    sorted_counts = before - before.gather(1, start.unsqueeze(-1).expand(-1, -1, vocab_size))
    return torch.empty_like(sorted_counts).scatter_(1, order.unsqueeze(-1).expand_as(onehot),
                                                    sorted_counts)


def add_beta_log_probs(counts: Tensor, beta: float) -> Tensor:
    """log (n_j + β) / (n + Sβ) for counts (..., S)."""
    return torch.log(counts + beta) - torch.log(counts.sum(-1, keepdim=True)
                                                 + beta * counts.shape[-1])


class MarkovTask(Task):
    family = "markov"
    kind = "tokens"
    Config = MarkovConfig
    description = "random order-k Markov chains, rows ~ Dir(beta); Bayes = add-beta smoothing"

    def latent_floats(self) -> int:
        return self.config.vocab_size ** self.config.order * self.config.vocab_size  # the kernel

    @property
    def input_dim(self) -> int:
        return self.config.vocab_size

    output_dim = input_dim

    def sample(self, n: int, generator: torch.Generator) -> Batch:
        return self.sample_given(self.draw_latent(n, generator), generator)

    def draw_latent(self, n: int, generator: torch.Generator) -> dict[str, Tensor]:
        """n kernels (n, S^k, S), every row ~ Dir(β·1)."""
        k, S = self.config.order, self.config.vocab_size
        # float64, drawn in log space (tasks/distributions.py): for small beta most of a row's
        # mass sits on one symbol and the rest lies below float32's range.
        alpha = torch.full((n, S**k, S), self.config.beta, dtype=torch.float64,
                           device=generator.device)
        return {"kernel": dirichlet(alpha, generator)}

    def sample_given(self, latent: dict[str, Tensor], generator: torch.Generator) -> Batch:
        """One chain per kernel of `latent`: k uniform tokens, then the kernel's transitions."""
        k, S, T = self.config.order, self.config.vocab_size, self.config.seq_len
        device = generator.device
        kernel = latent["kernel"].to(device)
        n = kernel.shape[0]
        cdf = kernel.cumsum(-1)
        tokens = torch.empty(n, T + 1, dtype=torch.long, device=device)
        tokens[:, :k] = torch.randint(S, (n, min(k, T + 1)), generator=generator, device=device)
        uniforms = torch.rand(n, T + 1, 1, generator=generator, device=device)
        context = context_ids(tokens[:, :k], k, S)[:, -1] if k <= T + 1 else None
        rows = torch.arange(n, device=device)
        for t in range(k, T + 1):  # a loop over time only; each step is batched
            row_cdf = cdf[rows, context]
            nxt = inverse_cdf(row_cdf, uniforms[:, t])  # never a zero-probability symbol
            tokens[:, t] = nxt
            context = (context * S + nxt) % S**k
        return Batch(inputs=tokens[:, :T], targets=tokens[:, 1:],
                     loss_mask=torch.ones(n, T, dtype=torch.bool, device=device),
                     latent={"kernel": kernel})

    def references(self) -> dict[str, Reference]:
        return {
            "bayes": Reference("bayes", "bayes", "add-beta smoothing: the exact posterior "
                               "predictive under the Dirichlet prior", self.add_beta),
            "clairvoyant": Reference("clairvoyant", "bound", "the true kernel of each "
                                     "sequence (knows the latent)", self.clairvoyant),
            "unigram": Reference("unigram", "baseline", "in-context add-beta on symbol "
                                 "counts (ignores the context)", self.unigram),
        }

    def _contexts(self, batch: Batch) -> tuple[Tensor, Tensor]:
        k, S = self.config.order, self.config.vocab_size
        ids = context_ids(batch.inputs, k, S)
        return ids, ids < S**k

    def add_beta(self, batch: Batch) -> Tensor:
        S = self.config.vocab_size
        groups, valid = self._contexts(batch)
        logp = add_beta_log_probs(counts_in_context(groups, batch.targets, S), self.config.beta)
        return torch.where(valid.unsqueeze(-1), logp, torch.full_like(logp, -math.log(S)))

    def clairvoyant(self, batch: Batch) -> Tensor:
        S = self.config.vocab_size
        groups, valid = self._contexts(batch)
        kernel = batch.latent["kernel"].double()
        kernel = kernel / kernel.sum(-1, keepdim=True)  # rows sum to 1 up to rounding
        rows = kernel.gather(1, groups.clamp_max(S**self.config.order - 1).unsqueeze(-1)
                             .expand(-1, -1, S))
        return torch.where(valid.unsqueeze(-1), rows.log(), torch.full_like(rows, -math.log(S)))

    def unigram(self, batch: Batch) -> Tensor:
        counts = torch.nn.functional.one_hot(batch.inputs, self.config.vocab_size).double()
        return add_beta_log_probs(counts.cumsum(1), self.config.beta)
