"""Switching Markov chains (paper 000 §5.1, appendix E.7): a random order-k chain that is
restarted with a fresh kernel whenever a switch token appears.

Alphabet: the S Markov symbols 0..S-1 plus the switch token S (the last index), so the vocabulary
has S + 1 entries. Every token x_0..x_T is, independently of everything else, the switch token
with probability p_switch (a parallel Bernoulli process, E.7 step 3). Otherwise it is a Markov
symbol from the current segment, where a segment is the stretch that starts at the beginning of
the sequence or right after a switch:
- the first k symbols of a segment are uniform on 0..S-1 (a restart, exactly as at the start
  of a plain Markov sequence, tasks/markov.py);
- later symbols follow the segment's own kernel P given the k previous symbols, the S^k rows of
  P drawn i.i.d. from Dir(β·1) when the segment begins (E.7 step 2).

Bayes predictor. A switch is independent of the kernel and of the past, so the next token is S
with probability p_switch, and otherwise a Markov symbol whose posterior predictive only depends
on the symbols since the last switch (earlier segments used independent kernels):
    P(S) = p_switch,    P(j) = (1 − p_switch) · (n_j + β) / (n + Sβ),
with n_j the number of times j followed the current context within the current segment; while
fewer than k symbols have followed the last switch the next symbol is uniform, P(j) =
(1 − p_switch) / S. This is exact: the add-β estimator reset at every switch (§5.1).

Mechanism probe (paper 000 §5.1, Fig. 13: one-layer Mamba "sets a_t to be zero at every switch,
and a_t = 1 otherwise"): the task asks for the model probe "decay" (a model's per-position
multiplicative state decay, e.g. Mamba's a_t = exp(Δ_t A) per layer and head; models/mamba.py),
and `summarize_probes` records, per layer and head, its mean over the held-out input positions
holding the switch token and over all other positions (metrics.probe in the run record).

Latent, memory-sane: only segments that generate a scored target need a kernel, and a sequence
of T + 1 tokens rarely has more than a few, so `kernels` has shape (n, M, S^k, S) with M one more
than the largest number of switches among x_0..x_{T-1} in the batch (at most T + 1); `segment`
(n, T) says which kernel generated each target, a segment starting right after each switch.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from tasks.base import Batch, Reference, Task
from tasks.configs import SwitchingMarkovConfig
from tasks.distributions import (batch_chunks, categorical, chain_states,
                                 dirichlet, inverse_cdf_table, scan_pays)
from tasks.markov import add_beta_log_probs, context_ids, context_steps, counts_in_context
from tasks.stats import ratio_interval


def segment_layout(tokens: Tensor, switch: int) -> tuple[Tensor, Tensor]:
    """For each position t of tokens (B, L): the segment index (number of switch tokens among
    x_0..x_t, so a switch opens the next segment) and the run length (number of symbols after
    the last switch up to and including x_t; 0 on a switch, t + 1 when there was none)."""
    is_switch = tokens == switch
    time = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    last_switch = torch.where(is_switch, time, torch.full_like(time, -1)).cummax(1).values
    return is_switch.long().cumsum(1), time - last_switch


class SwitchingMarkovTask(Task):
    family = "switching_markov"
    kind = "tokens"
    Config = SwitchingMarkovConfig
    description = ("order-k Markov chains restarted with a new Dir(beta) kernel at switch tokens "
                   "(prob p_switch); Bayes = add-beta reset at every switch")

    probes = ("decay",)

    def latent_floats(self) -> int:
        c = self.config  # one kernel per segment; segments ~ 1 + Binomial(T, p), 4 sd above
        segments = 1 + c.p_switch * c.seq_len + 4 * (c.p_switch * c.seq_len) ** 0.5 + 1
        return int(segments * c.vocab_size ** c.order * c.vocab_size)

    @property
    def input_dim(self) -> int:
        return self.config.vocab_size + 1

    output_dim = input_dim

    @property
    def switch_token(self) -> int:
        return self.config.vocab_size

    def sample(self, n: int, generator: torch.Generator) -> Batch:
        """Every random number is drawn first, in the loop's order (the kernel draws of steps
        1..T as one (T, n) draw: on the CPU the same numbers), then the contexts follow by a scan
        over time (tasks/distributions.py chain_states): on the CPU bit for bit
        `_sample_sequential`, elsewhere the same law."""
        k, S, T = self.config.order, self.config.vocab_size, self.config.seq_len
        if not scan_pays(n, S**k):
            return self._sample_sequential(n, generator)
        device = generator.device
        switches, segment, kernels, uniform_symbols = self._draw_segments(n, generator)
        kernel_uniforms = torch.rand(T, n, generator=generator, device=device,
                                     dtype=kernels.dtype).T
        # symbols since the last switch before each step t >= 1: the first k of a segment are
        # uniform (segment_layout on the switch indicators, 1 marking a switch)
        run_before = segment_layout(switches[:, :T].long(), 1)[1]
        cdf = kernels.cumsum(-1)
        rows = torch.arange(n, device=device)
        later = []  # the symbols of steps 1..T (step 0's is uniform: no context yet)
        for part in batch_chunks(n, T * S**k * S):
            # the symbol every context draws at steps 1..T from its segment's kernel (drawn at
            # every step, as the loop does, and used only once k symbols follow the switch)
            segment_cdf = cdf[rows[part, None], segment[part]]  # (chunk, T, S^k, S)
            drawn = inverse_cdf_table(segment_cdf, kernel_uniforms[part, :, None])[..., 0, :]
            restart = run_before[part, :, None] < k
            step_symbols = torch.where(restart, uniform_symbols[part, 1:, None], drawn)
            contexts = chain_states(context_steps(step_symbols, S), uniform_symbols[part, 0])
            later.append(contexts % S)  # a context's last digit is its newest symbol
        symbols = torch.cat([uniform_symbols[:, :1], torch.cat(later)], 1)
        tokens = torch.where(switches, S, symbols)
        return self._batch(tokens, kernels, segment)

    def _draw_segments(self, n: int, generator: torch.Generator
                       ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The switch indicators (n, T + 1), the segment of each target (n, T), one kernel per
        segment (n, M, S^k, S) and the restart symbols (n, T + 1)."""
        k, S, T = self.config.order, self.config.vocab_size, self.config.seq_len
        device = generator.device
        # The switch process is independent of the symbols, so it is drawn first; it fixes the
        # segments and hence how many kernels the batch needs.
        switches = torch.rand(n, T + 1, generator=generator, device=device) < self.config.p_switch
        segment = switches[:, :T].long().cumsum(1)  # kernel that generates target t (= x_{t+1})
        num_kernels = int(segment.max()) + 1  # a data-dependent shape: a host sync on a GPU
        alpha = torch.full((n, num_kernels, S**k, S), self.config.beta, dtype=torch.float64,
                           device=device)
        kernels = dirichlet(alpha, generator)
        uniform_symbols = torch.randint(S, (n, T + 1), generator=generator, device=device)
        return switches, segment, kernels, uniform_symbols

    def _sample_sequential(self, n: int, generator: torch.Generator) -> Batch:
        """sample step by step, a loop over time: its test oracle, and the faster form where
        the scan's tables would be large (tasks/distributions.py scan_pays)."""
        k, S, T = self.config.order, self.config.vocab_size, self.config.seq_len
        device = generator.device
        switches, segment, kernels, uniform_symbols = self._draw_segments(n, generator)
        tokens = torch.empty(n, T + 1, dtype=torch.long, device=device)
        rows = torch.arange(n, device=device)
        run = torch.zeros(n, dtype=torch.long, device=device)  # symbols since the last switch
        context = torch.zeros(n, dtype=torch.long, device=device)  # last k symbols, base S
        for t in range(T + 1):  # a loop over time only; each step is batched
            if t == 0:
                from_kernel = uniform_symbols[:, 0]  # no context yet: run = 0 < k
            else:
                from_kernel = categorical(kernels[rows, segment[:, t - 1], context], generator)
            symbol = torch.where(run < k, uniform_symbols[:, t], from_kernel)
            tokens[:, t] = torch.where(switches[:, t], S, symbol)
            run = torch.where(switches[:, t], 0, run + 1)
            # Stale right after a switch, but only read once k new symbols have refilled it.
            context = (context * S + symbol) % S**k
        return self._batch(tokens, kernels, segment)

    def _batch(self, tokens: Tensor, kernels: Tensor, segment: Tensor) -> Batch:
        T = self.config.seq_len
        return Batch(inputs=tokens[:, :T], targets=tokens[:, 1:],
                     loss_mask=torch.ones(len(tokens), T, dtype=torch.bool, device=tokens.device),
                     latent={"kernels": kernels, "segment": segment})

    def references(self) -> dict[str, Reference]:
        return {
            "bayes": Reference("bayes", "bayes", "p_switch on the switch token, (1 - p_switch) "
                               "x add-beta on the counts since the last switch: the exact "
                               "posterior predictive", self.bayes),
            "clairvoyant": Reference("clairvoyant", "bound", "p_switch on the switch token, "
                                     "(1 - p_switch) x the true kernel of the current segment "
                                     "(knows the latent)", self.clairvoyant),
            "no_reset": Reference("no_reset", "baseline", "as bayes, but add-beta on the counts "
                                  "of the whole sequence, never reset at a switch",
                                  self.no_reset),
        }

    def _contexts(self, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        """Segment index, context id in [0, S^k) and whether the context is a full window of k
        symbols inside the current segment (else the next symbol is uniform)."""
        k, S = self.config.order, self.config.vocab_size
        segment, run = segment_layout(batch.inputs, self.switch_token)
        valid = run >= k
        ids = torch.where(valid, context_ids(batch.inputs, k, S), S**k)
        return segment, ids, valid

    def _with_switch(self, symbol_log_probs: Tensor, valid: Tensor) -> Tensor:
        """Mixes the symbol predictive (uniform where there is no full context) with the switch."""
        S, p = self.config.vocab_size, self.config.p_switch
        symbols = torch.where(valid.unsqueeze(-1), symbol_log_probs,
                              torch.full_like(symbol_log_probs, -math.log(S)))
        switch = torch.full_like(symbols[..., :1], math.log(p) if p > 0 else -math.inf)
        return torch.cat([symbols + math.log1p(-p), switch], -1)

    def _add_beta(self, batch: Batch, groups: Tensor) -> Tensor:
        S = self.config.vocab_size
        # Counting over S + 1 outcomes and dropping the switch column: a switch says nothing
        # about the kernel, and it ends the segment, so its group is never used again anyway.
        counts = counts_in_context(groups, batch.targets, S + 1)[..., :S]
        return add_beta_log_probs(counts, self.config.beta)

    def bayes(self, batch: Batch) -> Tensor:
        segment, ids, valid = self._contexts(batch)
        groups = segment * (self.config.vocab_size**self.config.order + 1) + ids
        return self._with_switch(self._add_beta(batch, groups), valid)

    def no_reset(self, batch: Batch) -> Tensor:
        _, ids, valid = self._contexts(batch)
        return self._with_switch(self._add_beta(batch, ids), valid)

    def clairvoyant(self, batch: Batch) -> Tensor:
        k, S = self.config.order, self.config.vocab_size
        segment, ids, valid = self._contexts(batch)
        kernels = batch.latent["kernels"].double()
        kernels = kernels / kernels.sum(-1, keepdim=True)
        flat = kernels.flatten(1, 2)  # (B, M·S^k, S)
        row = segment * S**k + ids.clamp_max(S**k - 1)  # invalid contexts: any row, unused
        rows = flat.gather(1, row.unsqueeze(-1).expand(-1, -1, S))
        return self._with_switch(rows.log(), valid)

    def summarize_probes(self, batch: Batch, probes: dict[str, Tensor]) -> dict:
        """Mean decay a_t at the input positions that hold the switch token and elsewhere, per
        layer and head ([layer][head]), their means over layers and heads with a bootstrap
        interval over sequences (`decay_at_switch_mean_ci`), and the number of positions of
        each kind; {} when the model has no "decay" probe. Fig. 13's mechanism: ≈ 0 at
        switches, ≈ 1 elsewhere."""
        if "decay" not in probes:
            return {}
        decay = probes["decay"].double().cpu()  # (B, T, layers, heads)
        switch = (batch.inputs.cpu() == self.switch_token)[..., None, None].double()
        positions = float(switch.sum())
        others = switch.shape[0] * switch.shape[1] - positions

        def mean(weight: Tensor, count: float) -> list | None:
            return ((decay * weight).sum((0, 1)) / count).tolist() if count else None

        at_switch, elsewhere = mean(switch, positions), mean(1 - switch, others)

        def overall(per_head: list | None) -> float | None:  # mean over layers and heads
            return float(torch.tensor(per_head).mean()) if per_head is not None else None

        per_position = decay.mean((2, 3))  # (B, T): a_t averaged over layers and heads

        def interval(weight: Tensor, count: float) -> list | None:
            """The overall mean's bootstrap interval over sequences: a ratio of per-sequence
            sums of a_t to per-sequence position counts."""
            if not count:
                return None
            return ratio_interval((per_position * weight[..., 0, 0]).sum(1),
                                  weight[..., 0, 0].sum(1))

        return {"decay_at_switch": at_switch, "decay_elsewhere": elsewhere,
                "decay_at_switch_mean": overall(at_switch),
                "decay_at_switch_mean_ci": interval(switch, positions),
                "decay_elsewhere_mean": overall(elsewhere),
                "decay_elsewhere_mean_ci": interval(1 - switch, others),
                "switch_positions": int(positions), "other_positions": int(others)}
