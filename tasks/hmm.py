"""Random hidden Markov models as quasi-natural text (paper 004 §5.2, appendix B.3).

Each sequence gets its own HMM: H hidden "topics" whose transition matrix A (H × H) has rows
~ Dir(0.1) and whose emission matrix C (H × V) has rows ~ Dir(0.05); the paper uses H = 50,
V = 100 and draws a fresh (A, C) per task. Both are sparse: few characters per topic, few
successors per topic (the paper reads this as slow topic drift, but nothing favours staying in
the same state, so the topic typically moves among a handful of states at every step). The
paper does not say how the first topic is chosen; here z_0 is uniform on the H states. Then
x_t ~ C[z_t] and z_{t+1} ~ A[z_t].

References. The exact Bayes predictor would integrate the forward filter over the Dirichlet
posterior of (A, C), which is intractable, so the task offers
- `clairvoyant` (role "bound"): the forward filter that knows A and C, a lower bound on the Bayes
  loss (it knows more than any in-context predictor can);
- `unigram` / `bigram` (baselines): in-context add-β estimates of P(x) and P(x_{t+1} | x_t), with
  β = H · (emission concentration): a symbol's frequency pools H emission rows, whose Gamma
  weights add up to roughly a Dir(H·0.05) row (with one hidden state the unigram is then the
  exact Bayes predictor; with H = 50 this β is also near the best one on held-out data, while
  β = 0.05 smooths so little that both baselines lose to the uniform guess).
Accuracy against context length (paper 004 Fig. 3, top: "next-character prediction accuracy
versus context length k"): `summarize` puts into the record's metrics.task the top-1 accuracy of
the model and of every reference at k = 1, 2, 4, ..., seq_len, where the value "at k" averages
the positions whose context length lies in (k/2, k] (the bins of tasks/base.py: the
paper scores only the final prediction of 1000 sequences of each length k; averaging the bin
uses every held-out position once and is far less noisy), with its standard error over sequences.

Training tasks (`num_tasks`): 0 draws a fresh HMM for every training sequence; N > 0 trains on a
pool of N HMMs drawn once from the run seed (tasks/base.py `task_pool`), as B.3 trains on "50,000
tasks" (conf/task/hmm_paper.yaml); each training sequence is a fresh path of a pooled HMM. The
held-out set still draws a fresh HMM per sequence. At H = 50, V = 100 a pooled HMM holds 7,500
float64s: 3 GB for the paper's 50,000.

The matrices are drawn in float64: about one Dir(0.05) entry in 170 lies below 1e-45, where
float32 would store an exact zero (tasks/distributions.py draws them in log space, so none is NaN).
"""
from __future__ import annotations


import torch
from torch import Tensor

from tasks.base import Batch, LatentTask, Reference, doubling_lengths
from tasks.configs import HMMConfig
from tasks.distributions import (batch_chunks, categorical, chain_states,
                                 dirichlet, inverse_cdf, inverse_cdf_table, scan_pays)
from tasks.stats import binned_means
from tasks.markov import add_beta_log_probs, counts_in_context


def log_matmul(log_weights: Tensor, matrix: Tensor) -> Tensor:
    """log Σ_z exp(log_weights[b, z]) · matrix[b, z, k] for log_weights (B, H), matrix (B, H, K):
    a logsumexp whose inner sum is a batched matrix product (shifting by the max keeps the
    exponentials in [0, 1], so nothing overflows and the largest term never underflows)."""
    shift = log_weights.max(-1, keepdim=True).values
    weights = (log_weights - shift).exp().unsqueeze(1)
    return shift + torch.bmm(weights, matrix).squeeze(1).log()


def forward_filter_log_probs(transition: Tensor, emission: Tensor, tokens: Tensor) -> Tensor:
    """log P(x_{t+1} = v | x_0..x_t, A, C) for t < L - 1 and every v, shape (B, L - 1, V).

    transition A (B, H, H), emission C (B, H, V), tokens (B, L); the initial state is uniform.
    The filter carries the normalised log-belief log P(z_t | x_0..x_t), so it neither
    underflows nor overflows however long the sequence. Loop over time only."""
    batch, length = tokens.shape
    rows = torch.arange(batch, device=tokens.device)
    log_emission = emission.log()
    # log P(z_0 | x_0) = log C[z_0, x_0] + const: the uniform initial distribution cancels.
    log_belief = log_emission[rows, :, tokens[:, 0]]
    log_belief = log_belief - log_belief.logsumexp(-1, keepdim=True)
    out = []
    for t in range(length - 1):
        log_state = log_matmul(log_belief, transition)  # log P(z_{t+1} | x_0..x_t)
        out.append(log_matmul(log_state, emission))  # log P(x_{t+1} | x_0..x_t)
        log_belief = log_state + log_emission[rows, :, tokens[:, t + 1]]
        log_belief = log_belief - log_belief.logsumexp(-1, keepdim=True)
    return torch.stack(out, 1)


class HMMTask(LatentTask):
    family = "hmm"
    kind = "tokens"
    Config = HMMConfig
    description = ("random HMMs as quasi-text: A rows ~ Dir(0.1), C rows ~ Dir(0.05), fresh per "
                   "sequence; clairvoyant forward filter is a bound")

    def latent_floats(self) -> int:
        c = self.config  # transition and emission matrices and the hidden path
        return c.num_states * (c.num_states + c.vocab_size) + c.seq_len + 1

    @property
    def input_dim(self) -> int:
        return self.config.vocab_size

    output_dim = input_dim

    def draw_latent(self, n: int, generator: torch.Generator) -> dict[str, Tensor]:
        """n HMMs: transition (n, H, H) rows ~ Dir(0.1), emission (n, H, V) rows ~ Dir(0.05)."""
        H, V = self.config.num_states, self.config.vocab_size
        device = generator.device
        transition = dirichlet(torch.full((n, H, H), self.config.transition_concentration,
                                          dtype=torch.float64, device=device), generator)
        emission = dirichlet(torch.full((n, H, V), self.config.emission_concentration,
                                        dtype=torch.float64, device=device), generator)
        return {"transition": transition, "emission": emission}

    def sample_given(self, latent: dict[str, Tensor], generator: torch.Generator) -> Batch:
        """One sequence per HMM of `latent` (the hidden path is added to the latent). The uniforms
        of every categorical draw are drawn first, in the loop's order (on the CPU, successive
        draws of n numbers are the rows of one draw); the hidden path follows by a scan over time
        and the tokens from it: on the CPU bit for bit `_sample_sequential`, elsewhere the same
        law."""
        H, T = self.config.num_states, self.config.seq_len
        device = generator.device
        transition = latent["transition"].to(device)
        emission = latent["emission"].to(device)
        n = transition.shape[0]
        if not scan_pays(n, H):
            return self._sample_sequential(latent, generator)
        first_state = torch.randint(H, (n,), generator=generator, device=device)
        # the emission at t = 0, then the transition and the emission of each t >= 1
        uniforms = torch.rand(2 * T + 1, n, generator=generator, device=device,
                              dtype=transition.dtype).T
        emission_uniforms, transition_uniforms = uniforms[:, 0::2], uniforms[:, 1::2]
        transition_cdf, emission_cdf = transition.cumsum(-1), emission.cumsum(-1)
        states, tokens = [], []
        for part in batch_chunks(n, T * H + (T + 1) * emission.shape[-1]):
            later = chain_states(inverse_cdf_table(transition_cdf[part],
                                                   transition_uniforms[part]), first_state[part])
            path = torch.cat([first_state[part, None], later], 1)
            rows = emission_cdf[part].gather(1, path[..., None].expand(-1, -1, emission.shape[-1]))
            states.append(path)
            tokens.append(inverse_cdf(rows, emission_uniforms[part, :, None]))
        return self._batch(torch.cat(tokens), transition, emission, torch.cat(states))

    def _sample_sequential(self, latent: dict[str, Tensor], generator: torch.Generator) -> Batch:
        """sample_given step by step, a loop over time: its test oracle, and the faster form
        where the scan's tables would be large (tasks/distributions.py scan_pays)."""
        H, T = self.config.num_states, self.config.seq_len
        device = generator.device
        transition = latent["transition"].to(device)
        emission = latent["emission"].to(device)
        n = transition.shape[0]
        rows = torch.arange(n, device=device)
        states = torch.empty(n, T + 1, dtype=torch.long, device=device)
        tokens = torch.empty(n, T + 1, dtype=torch.long, device=device)
        states[:, 0] = torch.randint(H, (n,), generator=generator, device=device)
        for t in range(T + 1):  # a loop over time only; each step is batched
            if t > 0:
                states[:, t] = categorical(transition[rows, states[:, t - 1]], generator)
            tokens[:, t] = categorical(emission[rows, states[:, t]], generator)
        return self._batch(tokens, transition, emission, states)

    def _batch(self, tokens: Tensor, transition: Tensor, emission: Tensor,
               states: Tensor) -> Batch:
        T = self.config.seq_len
        return Batch(inputs=tokens[:, :T], targets=tokens[:, 1:],
                     loss_mask=torch.ones(len(tokens), T, dtype=torch.bool, device=tokens.device),
                     latent={"transition": transition, "emission": emission, "states": states})

    def references(self) -> dict[str, Reference]:
        return {
            "clairvoyant": Reference("clairvoyant", "bound", "forward filter that knows each "
                                     "sequence's A and C: a lower bound on the Bayes loss",
                                     self.clairvoyant),
            "unigram": Reference("unigram", "baseline", "in-context add-beta on symbol counts",
                                 self.unigram),
            "bigram": Reference("bigram", "baseline", "in-context add-beta on counts of the "
                                "symbol following the current one", self.bigram),
        }

    def clairvoyant(self, batch: Batch) -> Tensor:
        transition = batch.latent["transition"].double()
        emission = batch.latent["emission"].double()
        transition = transition / transition.sum(-1, keepdim=True)
        emission = emission / emission.sum(-1, keepdim=True)
        tokens = torch.cat([batch.inputs, batch.targets[:, -1:]], 1)
        return forward_filter_log_probs(transition, emission, tokens)

    @property
    def baseline_beta(self) -> float:
        return self.config.num_states * self.config.emission_concentration

    def unigram(self, batch: Batch) -> Tensor:
        counts = torch.nn.functional.one_hot(batch.inputs, self.config.vocab_size).double()
        return add_beta_log_probs(counts.cumsum(1), self.baseline_beta)

    def bigram(self, batch: Batch) -> Tensor:
        counts = counts_in_context(batch.inputs, batch.targets, self.config.vocab_size)
        return add_beta_log_probs(counts, self.baseline_beta)

    # --- the paper's accuracy-vs-context-length curve (Fig. 3) ---------------------------------
    def summarize(self, batch: Batch, losses: dict[str, Tensor],
                  scores: dict[str, dict[str, Tensor]] | None = None) -> dict:
        """Top-1 accuracy of every predictor with top-1 hits in `scores`, per context-length bin
        k = 1, 2, 4, ..., seq_len (see the module docstring): {"context_lengths": ks,
        "accuracy_by_context_length": {name: [...]}, "accuracy_by_context_length_stderr":
        {name: [...]}}; a bin's value is the mean over sequences of each sequence's hit rate
        over its scored positions in the bin (None where no position is scored)."""
        ks = doubling_lengths(1, self.config.seq_len)
        summary: dict = {"context_lengths": ks, "accuracy_by_context_length": {},
                         "accuracy_by_context_length_stderr": {}}
        for name, score in (scores or {}).items():
            if "correct" in score:
                mean, stderr = binned_means(score["correct"], batch.loss_mask, ks)
                summary["accuracy_by_context_length"][name] = mean
                summary["accuracy_by_context_length_stderr"][name] = stderr
        return summary
