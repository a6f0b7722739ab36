"""Random Markov chains of order k (paper 000 §2.1) and the add-β (Laplacian smoothing) oracle.

Each sequence gets its own kernel: every one of the S^k context rows is drawn from Dir(β·1). The
first k tokens are uniform; token t+1 ~ P[x_{t-k+1..t}] afterwards. The Bayes-optimal next-token
predictor under this prior is the add-β estimator (n_j + β) / (n + Sβ), with n_j the number of
times j followed the current context so far (paper 000 §2.4); for positions before the first
full context it is uniform.

Hold-out region of the simplex (`simplex_split` = s, paper 000 App. E.5 and Table 2: "we trained
Mamba only on sequences from a subset of the Markov simplex, specifically the interval [0, 0.5],
and we tested it on sequences from its complement [0.5, 1]"). A binary kernel row is the point
(1 - p, p) of the 1-simplex, p = P(next = 1 | context) (the reference code draws p ~ U[0, 1] per
row, and Table 2 reports P(x_t = 1 | x_1^{t-1})); so with s > 0 every training row is drawn from
Dir(β·1) conditioned on p ≤ s, every held-out row conditioned on p > s (for S > 2, p is still
the probability of symbol 1). Both by rejection, row by row; each region must hold at least
MIN_REGION_MASS of the prior (tasks/configs.py checks it when the config is built). `simplex_eval=training` scores
the same run on held-out kernels of the training region instead: the in-distribution control
of the experiment (a model that learned add-β where it trained, and whose distance to it
does not fall on the complement, did not generalise; one that learned nothing shows neither). The held-out set then leaves
the training prior, `held_out_from_prior` is False, and `bayes` (add-β, the posterior predictive
of the unrestricted prior, the paper's "optimal Laplacian smoothing") is exact for neither the
training nor the held-out distribution; it is asymptotically minimax, which is what the paper
tests. `summarize` reports, per context-length bin (tasks/base.py), the mean total
variation distance of each predictor to add-β, which for S = 2 is Table 2's
|P_θ(x_t = 1 | x_1^{t-1}) - P*(x_t = 1 | x_1^{t-1})|.

Training tasks (`num_tasks`, as in paper 004's finite-task experiments): N > 0 trains on a pool
of N kernels drawn once from the run seed (tasks/base.py `task_pool`), each training sequence
following one picked uniformly; the held-out set still draws a fresh kernel per sequence.
"""
from __future__ import annotations

import math
from statistics import NormalDist

import torch
from torch import Tensor

from tasks.base import TEST_STREAM, Batch, LatentTask, Reference, doubling_lengths, make_generator
from tasks.configs import MarkovConfig
from tasks.distributions import (batch_chunks, chain_states, dirichlet,
                                 inverse_cdf, inverse_cdf_table, scan_pays)
from tasks.stats import binned_means

MAX_REJECTION_ROUNDS = 10_000  # a row still rejected after this many rounds is a bug (p < 1e-43)


def restricted_dirichlet(shape: tuple[int, ...], beta: float, split: float, above: bool,
                         generator: torch.Generator) -> Tensor:
    """Rows (*shape, S) ~ Dir(β·1) conditioned on row[1] <= split (above=False) or row[1] > split
    (above=True): each rejected row is redrawn until it falls in the region (exact rejection
    sampling: an accepted row has the conditional law), float64."""
    rows = dirichlet(torch.full(shape, beta, dtype=torch.float64, device=generator.device),
                     generator).reshape(-1, shape[-1])

    def rejected(r: Tensor) -> Tensor:
        return (r[:, 1] <= split) if above else (r[:, 1] > split)

    pending = rejected(rows).nonzero().squeeze(1)
    for _ in range(MAX_REJECTION_ROUNDS):
        if len(pending) == 0:
            return rows.reshape(shape)
        fresh = dirichlet(torch.full((len(pending), shape[-1]), beta, dtype=torch.float64,
                                     device=generator.device), generator)
        rows[pending] = fresh
        pending = pending[rejected(fresh)]
    raise RuntimeError(f"markov simplex_split: {len(pending)} kernel rows still outside the "
                       f"region after {MAX_REJECTION_ROUNDS} rounds")


def context_ids(tokens: Tensor, order: int, vocab_size: int) -> Tensor:
    """Index in [0, S^k) of the context x_{t-k+1..t} ending at each position (base-S digits,
    most recent token least significant); positions t < k-1 get S^k (no full context yet)."""
    ids = torch.zeros_like(tokens)
    for lag in range(order):
        shifted = torch.nn.functional.pad(tokens, (lag, 0))[:, : tokens.shape[1]]
        ids = ids + shifted * vocab_size**lag
    ids[:, : order - 1] = vocab_size**order
    return ids


def context_steps(symbols: Tensor, vocab_size: int) -> Tensor:
    """The context that follows each context c in [0, S^k) when symbols[..., c] comes next:
    (c·S + symbol) mod S^k, the oldest symbol dropped; symbols (..., S^k)."""
    contexts = symbols.shape[-1]
    kept = torch.arange(contexts, device=symbols.device) % (contexts // vocab_size) * vocab_size
    return kept + symbols


def kernel_tokens(cdf: Tensor, start: Tensor, uniforms: Tensor) -> Tensor:
    """Tokens (n, L) of order-k chains from contexts `start` (n,) with kernel CDFs cdf (n, S^k, S),
    step t drawing by inverse CDF at uniforms[:, t]: the table of the symbol that follows every
    context at every step, then the contexts by a scan (a context's last digit is its newest
    symbol)."""
    vocab_size = cdf.shape[-1]
    symbols = inverse_cdf_table(cdf, uniforms)  # (n, L, S^k)
    return chain_states(context_steps(symbols, vocab_size), start) % vocab_size


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


def smallest_mean_interval(values: Tensor, level: float = 0.95) -> list | None:
    """A 95% interval for the smallest of the T position means of values (B, T) over
    sequences: [min_t (m_t - z s_t), min_t (m_t + z s_t)], s_t the standard error of m_t and z
    the normal quantile that makes the T intervals hold together (Bonferroni: each misses with
    probability (1 - level) / T). Where they all hold, so does this one, whichever position has
    the smallest mean: a bootstrap of the minimum would not (it is biased low, and its interval
    can miss the estimate itself). None with fewer than two sequences."""
    count, positions = values.shape
    if count < 2:
        return None
    z = NormalDist().inv_cdf(1 - (1 - level) / (2 * positions))
    means = values.mean(0)
    half = z * values.std(0) / math.sqrt(count)
    return [float((means - half).min()), float((means + half).min())]


def decay_summary(decay: Tensor) -> dict:
    """Mamba's decay a_t (B, T, layers, heads) on the held-out inputs (paper 000 Fig. 4): its
    mean per position over sequences, layers and heads (`decay_by_position`), the smallest of
    those means (`decay_min`: "a_t ≈ 1 for all t" asks it to be near 1; `decay_min_ci`, its
    interval: smallest_mean_interval), the overall mean and
    the 5th percentile of all a_t values, and per [layer][head] means."""
    decay = decay.double().cpu()
    by_position, flat = decay.mean((0, 2, 3)), decay.flatten()
    return {"decay_by_position": by_position.tolist(),
            "decay_min": float(by_position.min()),
            "decay_min_ci": smallest_mean_interval(decay.mean((2, 3))),
            "decay_mean": float(decay.mean()),
            "decay_p05": float(flat.kthvalue(max(1, math.ceil(0.05 * flat.numel())))[0]),
            "decay_per_head": decay.mean((0, 1)).tolist()}


def group_means(values: Tensor, ids: Tensor, groups: int) -> Tensor:
    """Mean of values (B, T, ...) over the positions with ids (B, T) == g, for g < groups:
    (groups, ...), NaN for a group that never occurs."""
    flat, index = values.reshape(-1, *values.shape[2:]), ids.reshape(-1)
    sums = flat.new_zeros(groups, *flat.shape[1:]).index_add_(0, index, flat)
    counts = torch.bincount(index, minlength=groups).to(flat.dtype)
    return sums / counts.reshape(-1, *[1] * (flat.dim() - 1))


def nested(values: Tensor, shape: tuple[int, ...]) -> list:
    """values as nested lists of `shape` with None where a context never occurred (NaN)."""
    items = [None if math.isnan(v) else v for v in values.reshape(-1).tolist()]
    for size in reversed(shape[1:]):
        items = [items[i:i + size] for i in range(0, len(items), size)]
    return items


def count_probe_summary(tokens: Tensor, probes: dict[str, Tensor], vocab_size: int) -> dict:
    """Paper 000 App. C.1 / Fig. 5 on a first-order chain over S symbols, from MambaZero's probes
    (models/mamba.py MambaZero.probe). Positions t >= 2 (1-based: those with a previous token)
    are grouped by their window (x_{t-1}, x_t); b^(ij) is the mean of b_t over positions with
    window (i, j), c^(lk) that of c_t over window (l, k), c^(k) over current token k (Fig. 5's
    index, averaging the previous token out); a mean inner product over all pairs of such
    positions is the inner product of these means (summed over groups). With w = 2 every b_t, c_t
    of one window is the same vector, so the means are those vectors. Contexts that do not occur
    are None and left out of the scalars.

    - bc_inner[i][j][k] = b^(ij)ᵀc^(k); bc_inner_by_window[i][j][l][k] = b^(ij)ᵀc^(lk);
    - bc_wrong_ratio: max |b^(ij)ᵀc^(lk)| over i ≠ k / min over i = k (windows resolved, so
      no cancellation between previous tokens; the paper: -> 0). Invariant to the rescalings
      of B against x~ or C.
    With the logit probes (the L1 head) and a_t = 1, Eq. (10) reads logit_t = u + Σ n_ij v^(ij):
    - count_vector_scale[l][k][j] = v^(kj)_j, the coefficient of n_kj in logit j at window (l, k),
      v^(ij) = W_ℓ W_o x~^(ij) b^(ij)ᵀc^(lk) (mean of logit_write_s b_s over window (i, j));
    - count_free[x1][l][k] = u = W_ℓ x_t + W_ℓ W_o x~^(x1) b^(x1)ᵀc^(lk), the count-independent
      vector (its first-token term from the sequences starting with x1);
    - count_free_beta[x1][l][k][j] = u_j / v^(kj)_j and its min and max over all of them:
      Fig. 5b's coordinates -> β. Under the L1 normalisation the logits of a window are only
      defined up to a positive factor, so the raw u is not identifiable; the ratio is, and is
      β exactly for add-β (logit ∝ n_k· + β·1)."""
    S = vocab_size
    tokens = tokens.cpu()
    window = tokens[:, :-1] * S + tokens[:, 1:]  # (x_{t-1}, x_t) for positions t >= 2
    current = tokens[:, 1:]
    b, c = (probes[name].double().cpu() for name in ("ssm_b", "ssm_c"))  # (B, T, groups, N)
    b_ij = group_means(b[:, 1:], window, S * S)
    c_lk = group_means(c[:, 1:], window, S * S)
    c_k = group_means(c[:, 1:], current, S)
    by_window = torch.einsum("agn,cgn->ac", b_ij, c_lk)  # [ij][lk]
    source = torch.arange(S * S) // S  # i of row ij
    target = torch.arange(S * S) % S  # k of column lk
    wrong = source[:, None] != target[None, :]
    present = ~by_window.isnan()
    worst_wrong = by_window[wrong & present].abs().max() if (wrong & present).any() else None
    least_right = by_window[~wrong & present].abs().min() if (~wrong & present).any() else None
    summary = {"bc_inner": nested(torch.einsum("agn,kgn->ak", b_ij, c_k), (S, S, S)),
               "bc_inner_by_window": nested(by_window, (S, S, S, S)),
               "bc_wrong_ratio": (float(worst_wrong / least_right)
                                  if worst_wrong is not None and least_right is not None
                                  else None)}
    if "logit_write" not in probes or "logit_direct" not in probes:
        return summary
    write = probes["logit_write"].double().cpu()  # (B, T, groups, S)
    direct = probes["logit_direct"].double().cpu()  # (B, T, S)
    outer = write[..., :, None] * b[..., None, :]  # (B, T, groups, S, N)
    counted = torch.einsum("agdn,cgn->acd", group_means(outer[:, 1:], window, S * S), c_lk)
    first = torch.einsum("xgdn,cgn->xcd", group_means(outer[:, :1], tokens[:, :1], S), c_lk)
    free = group_means(direct[:, 1:], current, S)[target] + first  # [x1][lk][d]
    rows = target[:, None] * S + torch.arange(S)  # v^(kj) for window lk: row k·S + j
    scale = counted[rows, torch.arange(S * S)[:, None], torch.arange(S)]  # [lk][j]
    beta = free / scale
    finite = beta[~beta.isnan()]
    summary.update({"count_vector_scale": nested(scale, (S, S, S)),
                    "count_free": nested(free, (S, S, S, S)),
                    "count_free_beta": nested(beta, (S, S, S, S)),
                    "count_free_beta_min": float(finite.min()) if len(finite) else None,
                    "count_free_beta_max": float(finite.max()) if len(finite) else None})
    return summary


class MarkovTask(LatentTask):
    family = "markov"
    kind = "tokens"
    Config = MarkovConfig
    description = "random order-k Markov chains, rows ~ Dir(beta); Bayes = add-beta smoothing"
    probes = ("decay", "ssm_b", "ssm_c", "logit_direct", "logit_write")

    def latent_floats(self) -> int:
        return self.config.vocab_size ** self.config.order * self.config.vocab_size  # the kernel

    @property
    def input_dim(self) -> int:
        return self.config.vocab_size

    output_dim = input_dim

    def draw_latent(self, n: int, generator: torch.Generator,
                    held_out: bool = False) -> dict[str, Tensor]:
        """n kernels (n, S^k, S), every row ~ Dir(β·1); with simplex_split, conditioned on the
        training region (P(1 | context) <= split) or, for held_out, on its complement."""
        k, S, c = self.config.order, self.config.vocab_size, self.config
        if c.simplex_split:
            return {"kernel": restricted_dirichlet((n, S**k, S), c.beta, c.simplex_split,
                                                   held_out, generator)}
        # float64, drawn in log space (tasks/distributions.py): for small beta most of a row's
        # mass sits on one symbol and the rest lies below float32's range.
        alpha = torch.full((n, S**k, S), c.beta, dtype=torch.float64, device=generator.device)
        return {"kernel": dirichlet(alpha, generator)}

    def held_out(self, n: int, split: int = TEST_STREAM) -> Batch:
        """The fixed evaluation set; with simplex_split, kernels from the held-out region (the
        training region's with simplex_eval=training)."""
        generator = make_generator(split, 0)
        complement = self.config.simplex_eval == "complement"
        return self.sample_given(self.draw_latent(n, generator, held_out=complement), generator)

    @property
    def held_out_from_prior(self) -> bool:
        return self.config.simplex_split == 0

    def sample_given(self, latent: dict[str, Tensor], generator: torch.Generator) -> Batch:
        """One chain per kernel of `latent`: k uniform tokens, then the kernel's transitions.
        Every random number is drawn first and the path follows from them in parallel over time
        (tasks/distributions.py chain_states): bit for bit the path of `_sample_sequential`, which
        it uses itself where the scan does not pay."""
        k, S, T = self.config.order, self.config.vocab_size, self.config.seq_len
        device = generator.device
        kernel = latent["kernel"].to(device)
        n = kernel.shape[0]
        if not scan_pays(n, S**k):
            return self._sample_sequential(latent, generator)
        first = torch.randint(S, (n, min(k, T + 1)), generator=generator, device=device)
        uniforms = torch.rand(n, T + 1, generator=generator, device=device)
        cdf, start = kernel.cumsum(-1), context_ids(first, k, S)[:, -1]
        steps = max(0, T + 1 - k)
        later = [kernel_tokens(cdf[part], start[part], uniforms[part, k:])
                 for part in batch_chunks(n, steps * S**k)]
        return self._batch(torch.cat([first, torch.cat(later)], 1), kernel)

    def _sample_sequential(self, latent: dict[str, Tensor], generator: torch.Generator) -> Batch:
        """sample_given step by step, a loop over time: its test oracle, and the faster form
        where the scan's tables would be large (tasks/distributions.py scan_pays)."""
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
        return self._batch(tokens, kernel)

    def _batch(self, tokens: Tensor, kernel: Tensor) -> Batch:
        T = self.config.seq_len
        return Batch(inputs=tokens[:, :T], targets=tokens[:, 1:],
                     loss_mask=torch.ones(len(tokens), T, dtype=torch.bool, device=tokens.device),
                     latent={"kernel": kernel})

    def references(self) -> dict[str, Reference]:
        return {
            "bayes": Reference("bayes", "bayes", "add-beta smoothing: the exact posterior "
                               "predictive under the Dirichlet prior" + (
                                   " (the unrestricted one: with simplex_split, exact for "
                                   "neither the training nor the held-out region)"
                                   if self.config.simplex_split else ""), self.add_beta),
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

    # --- mechanism probes (paper 000 §4.2.1, App. C.1: Fig. 4's a_t, Fig. 5's b^(ij)ᵀc^(k)) -----
    def summarize_probes(self, batch: Batch, probes: dict[str, Tensor]) -> dict:
        """The "decay" summary (Fig. 4) when the model has that probe, and at order 1 the count
        mechanism of Fig. 5 when it has "ssm_b" and "ssm_c" (count_probe_summary); {} for a
        model with neither. Orders k > 1 get no Fig. 5 summary: the paper states it for first
        order only, and at order k the B and C vectors' contexts are k + 1 and k tokens."""
        summary = {}
        if "decay" in probes:
            summary.update(decay_summary(probes["decay"]))
        if self.config.order == 1 and "ssm_b" in probes and "ssm_c" in probes:
            summary.update(count_probe_summary(batch.inputs, probes, self.config.vocab_size))
        return summary

    # --- the hold-out experiment's distance to add-β by context length (paper 000 Table 2) -----
    def summarize(self, batch: Batch, losses: dict[str, Tensor],
                  scores: dict[str, dict[str, Tensor]] | None = None) -> dict:
        """With simplex_split: the mean total variation distance (L1 / 2) of every predictor's
        next-token distribution to add-β's, per context-length bin k = 1, 2, 4, ..., seq_len
        (tasks/base.py binned_means), with its standard error over sequences; for
        S = 2 it is paper 000 Table 2's |P_θ(x_t = 1 | ·) - P*(x_t = 1 | ·)|. Nothing without
        simplex_split."""
        if not self.config.simplex_split:
            return {}
        ks = doubling_lengths(1, self.config.seq_len)
        summary: dict = {"simplex_split": self.config.simplex_split, "context_lengths": ks,
                         "tv_to_bayes_by_context_length": {},
                         "tv_to_bayes_by_context_length_stderr": {}}
        for name, score in (scores or {}).items():
            if "l1" in score:
                mean, stderr = binned_means(score["l1"] / 2, batch.loss_mask, ks)
                summary["tv_to_bayes_by_context_length"][name] = mean
                summary["tv_to_bayes_by_context_length_stderr"][name] = stderr
        return summary
