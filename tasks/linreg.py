"""In-context linear regression (paper 002 §3-§4, appendix A.5/A.6; data as von Oswald et al. 2023).

Each sequence draws its own weights W ~ N(0, I) of shape (N, f), examples x_k ~ U(-1, 1)^f and
targets y_k = W x_k + ε_k with ε_k ~ N(0, σ² I). N = 1 is the paper's 1-D regression (A.5);
N = f its N-D regression (A.6; each of the N outputs is its own 1-D problem with its own row of
W, so every reference below acts on each output coordinate separately). With n examples, the
prediction for example j (j = 0 .. n-1) may use the j earlier examples and the query x_j.

Scored positions (`score`): "all" scores every example, so the loss curve covers every context
size 0 .. n-1; "last" scores only the final query of each prompt, which is what the paper trains
on and evaluates ("the model was expected to output the prediction for the query (test) x given
in the last timestep. The models were trained to minimize the mean squared error between the
test prediction and target", §4). The mask is the batch's `loss_mask`, so it sets both the
training loss and the held-out scores.

Prompt formats (`prompt`):
- "interleaved" (paper §3.2, Eqs. 19-20: x_1, y_1, x_2, y_2, ...). Positions alternate
  x-token [x_k, 0_N, 1] and y-token [0_f, y_k, 0], vectors of size f + N + 1; the last coordinate
  flags x-tokens. The target at the x_k position is y_k and only x-positions are scored, so the
  causal prediction at x_k is of y_k from x_0..x_k and y_0..y_{k-1}. The y-positions carry
  target 0 and are not scored. seq_len = 2n; an odd seq_len ends on the last query.
- "tokens" (paper §3.1 and §4.1, Eq. 14: constructed tokens c_t = [x_t y_t, x_{t+1}]). Position t
  holds [vec(y_{t-1} x_{t-1}ᵀ), x_t], a vector of size N·f + f, and its target is y_t; every
  position is scored and seq_len = n. For N = 1 this is the paper's c_{t-1} exactly; for N > 1
  the product is the outer product y xᵀ flattened row by row (the increment of the GD state Z_t,
  Eq. 17). The first token has no earlier example, so its product half is zero: [0, x_0]. An empty
  example adds nothing to the GD state Σ y xᵀ, so the paper's recurrence is unchanged, and y_0 is
  predicted from an empty context as in the interleaved format. Without this token the first
  example would be seen only through the product x_0 y_0, which hides x_0's scale and the sign of
  y_0, and the Bayes predictor would no longer be a ridge regression.

Out-of-distribution inputs (`eval_x_scale` = α, paper 002 §4.1 and Fig. 1D/2D: "we draw values
of inputs from U(-α, α)"): the held-out examples are x ~ U(-α, α)^f with y = W x + ε and W still
from the prior; training is unchanged. The Bayes reference stays exact. The posterior over W is
    p(W | X, Y) ∝ p(W) p(X) Π_k N(y_k; W x_k, σ²I) ∝ p(W) Π_k N(y_k; W x_k, σ²I):
the law of the inputs p(X) does not involve W, so it cancels, and the posterior (hence the
ridge posterior mean with λ = σ²) is the same function of (X, Y) whatever distribution drew X.
The posterior mean is the minimum-MSE prediction given any X, so it is still optimal on scaled
inputs, `held_out_from_prior` stays True (the only latent, W, is still drawn from the prior the
Bayes predictor assumes) and a model beating `bayes` there is still a bug. The GD baselines run
on the scaled examples with the step sizes tuned on the training distribution, as a model that
learned gradient descent would (the paper's comparison); `ols` and the oracle need no change.

Training tasks (`num_tasks`, the finite number of meta-training tasks of paper 004 §5.1 and
Fig. 2 left, there for LG-SSMs): N > 0 trains on a pool of N
weight matrices drawn once from the run seed (tasks/base.py `task_pool`), each training prompt
using one picked uniformly; the held-out set still draws fresh weights from the prior, so the
`bayes` reference (the prior's posterior mean) is the one a model must match to generalise.

References. Every one is a function of the prefix statistics S_xx = Σ_{k<j} x_k x_kᵀ,
S_xy = Σ_{k<j} x_k y_kᵀ and the query x_j, read from the inputs alone (so causal by
construction). They are "spectral filters": with S_xx = V diag(e) Vᵀ the prediction is
S_xyᵀ V diag(h(e)) Vᵀ x_j, one batched eigen-decomposition for all (sequence, prefix) pairs:
- bayes: the posterior mean of W, ridge with λ = σ² (h = 1/(e + σ²)); noiseless, the λ → 0 limit,
  minimum-norm least squares (the N(0, I) prior conditioned on X w = y has mean X⁺y).
- ols: minimum-norm least squares (h = 1/e on the range of S_xx); equals bayes when σ = 0.
- gd<K> for K in `gd_steps`: K steps of full-batch gradient descent on
  L(W) = 1/(2j) Σ_{k<j} |W x_k - y_k|² from W = 0 with step η_{K,j}, the paper's implicit model
  (Eq. 10) taken K times (A.2). h = c Σ_{i<K} (1 - c e)^i with c = η/j. The step size minimises the
  expected squared error for each context size j: for K = 1 in closed form (`gd1_step_size`), for
  K > 1 numerically on a fixed sample of TUNING_TASKS tasks (seed tag TUNING_STREAM), once per task
  instance.
- oracle (bound): W x_j, the clairvoyant prediction; its loss is the noise floor σ².

The trained predictor against one GD step as functions (paper 002 §4.1, Fig. 1B/2B;
`summarize_predictor`, metrics.probe): `gd_match` reads the learned coefficients of y_k x_k x_q
(Fig. 3), `gd_comparison` compares predictions and input sensitivities ∂ŷ/∂x_q on held-out
prompts (`comparison_metrics`).
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from tasks.base import TEST_STREAM, Batch, LatentTask, Reference, make_generator
from tasks.configs import LinRegConfig
from tasks.stats import ratio_interval


X_VAR = 1.0 / 3.0  # E[x_i²] for x_i ~ U(-1, 1)
X_M4 = 1.0 / 5.0  # E[x_i⁴]
TUNING_STREAM = 4  # seed tag of the step-size tuning sample; disjoint from train/val/test (1-3)
TUNING_TASKS = 4096
PINV_RTOL = 1e-10  # eigenvalues below this fraction of the largest count as zero
GD_MATCH_MAX_TOKENS = 2 * 10 ** 7  # the most prompt tokens gd_match reads a model on (~1 min)
COMPARISON_PROMPTS = 512  # held-out prompts of gd_comparison
COMPARISON_MAX_PASSES = 400  # backward passes (scored positions × outputs) gd_comparison may take


def gd1_step_size(context: Tensor, n_features: int, noise_std: float) -> Tensor:
    """MSE-optimal step η of one GD step from W = 0 (1/j-scaled gradient) per context size j.

    The prediction is c x_qᵀ S_xy with c = η/j. With A = S_xx, w ~ N(0, I), x ~ U(-1, 1)^f,
    s = E[x_i²], m4 = E[x_i⁴], the risk E[(c x_qᵀ Xᵀ y - y_q)²] is
        s (c² E tr A² - 2c E tr A + f) + c² σ² s E tr A + σ²,
    E tr A = j f s,  E tr A² = j (f m4 + f(f-1) s²) + j(j-1) f s²,
    minimised at c = E tr A / (E tr A² + σ² E tr A) = s / (m4 + (f + j - 2) s² + σ² s).
    Context size 0 has no gradient; its step is 0."""
    j = context.to(torch.float64)
    c = X_VAR / (X_M4 + (n_features + j - 2) * X_VAR ** 2 + noise_std ** 2 * X_VAR)
    return torch.where(j > 0, j * c, torch.zeros_like(j))


def interleave(x: Tensor, y: Tensor, seq_len: int) -> tuple[Tensor, Tensor, Tensor]:
    """The prompt x_0, y_0, x_1, y_1, ... cut to seq_len positions; x (B, n, f), y (B, n, N).

    x-token [x, 0, 1], y-token [0, y, 0]; the target y_k sits at the x_k position, the only scored
    positions. Returns inputs (B, T, f + N + 1), targets (B, T, N), loss_mask (B, T)."""
    batch, n, f = x.shape
    outputs = y.shape[-1]
    inputs = x.new_zeros(batch, 2 * n, f + outputs + 1)
    inputs[:, 0::2, :f] = x
    inputs[:, 0::2, -1] = 1.0
    inputs[:, 1::2, f:f + outputs] = y
    targets = y.new_zeros(batch, 2 * n, outputs)
    targets[:, 0::2] = y
    loss_mask = torch.zeros(batch, 2 * n, dtype=torch.bool, device=x.device)
    loss_mask[:, 0::2] = True
    return inputs[:, :seq_len], targets[:, :seq_len], loss_mask[:, :seq_len]


def last_scored(loss_mask: Tensor) -> Tensor:
    """loss_mask (B, T) with only the last scored position of each sequence kept (score=last)."""
    counts = loss_mask.long().cumsum(1)
    return loss_mask & (counts == counts[:, -1:])


def constructed_tokens(x: Tensor, y: Tensor) -> Tensor:
    """The paper's constructed tokens (B, n, N·f + f): position t holds [vec(y_{t-1} x_{t-1}ᵀ), x_t]
    (the outer product flattened row by row), position 0 holds [0, x_0]."""
    products = (y.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2)
    previous = torch.cat([torch.zeros_like(products[:, :1]), products[:, :-1]], dim=1)
    return torch.cat([previous, x], dim=-1)


def split_interleaved(inputs: Tensor, n_features: int, n_outputs: int) -> tuple[Tensor, Tensor]:
    """Inverse of `interleave`: x (B, n, f) and y (B, n, N). When seq_len is odd the last query
    has no y-token; its y is returned as 0 (no causal prediction can use it)."""
    x = inputs[:, 0::2, :n_features]
    y = inputs[:, 1::2, n_features:n_features + n_outputs]
    if y.shape[1] < x.shape[1]:
        y = torch.cat([y, y.new_zeros(y.shape[0], 1, n_outputs)], dim=1)
    return x, y


def to_positions(per_example: Tensor, seq_len: int) -> Tensor:
    """Place per-example predictions (B, n, N) at the x-positions of an interleaved prompt."""
    out = per_example.new_zeros(per_example.shape[0], seq_len, per_example.shape[-1])
    out[:, 0::2] = per_example[:, :(seq_len + 1) // 2]
    return out


def exclusive_cumsum(values: Tensor, dim: int = 1) -> Tensor:
    """Σ_{k<j} values_k along dim: the statistics of the examples before each query."""
    total = values.cumsum(dim)
    before = total.narrow(dim, 0, total.shape[dim] - 1)
    return torch.cat([torch.zeros_like(total.narrow(dim, 0, 1)), before], dim)


def filtered_prediction(xx: Tensor, xy: Tensor, query: Tensor, response) -> Tensor:
    """S_xyᵀ V diag(h(e)) Vᵀ x_q for S_xx = V diag(e) Vᵀ, batched over leading axes: xx (..., f, f),
    xy (..., f, N), query (..., f); `response` maps the eigenvalues (..., f) to h (..., f)."""
    eigenvalues, vectors = torch.linalg.eigh(xx)
    along_query = (vectors.transpose(-1, -2) @ query.unsqueeze(-1)).squeeze(-1)
    along_targets = vectors.transpose(-1, -2) @ xy
    return ((along_query * response(eigenvalues)).unsqueeze(-1) * along_targets).sum(-2)


def ridge_response(strength: float):
    """h(e) = 1/(e + λ): ridge regression with penalty λ."""
    return lambda e: 1.0 / (e.clamp_min(0.0) + strength)


def pinv_response(e: Tensor) -> Tensor:
    """1/e on the range of S_xx, 0 on its null space (the minimum-norm solution)."""
    keep = e > PINV_RTOL * e.amax(-1, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)
    return torch.where(keep, 1.0 / torch.where(keep, e, torch.ones_like(e)), torch.zeros_like(e))


def gd_response(steps: int, rate: Tensor):
    """K steps of W ← W - c (W S_xx - S_xyᵀ) from 0 give h(e) = c Σ_{i<K} (1 - c e)^i; rate is c per
    context size (n,) broadcast over the (B, n, f) eigenvalues."""
    def response(e: Tensor) -> Tensor:
        c = rate.to(e).unsqueeze(-1)
        shrink = 1.0 - c * e
        geometric = torch.ones_like(e)
        for _ in range(steps - 1):
            geometric = 1.0 + shrink * geometric
        return c * geometric
    return response


def gd_match(coefficients: Tensor, check: Tensor, gd1_step: float) -> dict:
    """Paper 002 Fig. 3 as a comparison that the model's symmetries cannot change: the learned
    coefficients G[k, a, b, c, d] of y_{k,b} x_{k,c} x_{q,d} in ŷ_a (LinearRegression
    `gd_coefficients`, one row per example k before the query) against one GD step from W = 0,
    whose G_k is (η/j) δ_ab δ_cd for every k (j examples). The trained parameters enter only
    through these products, so rescalings traded between the key, value and query maps, a basis
    change of the state and the choice of window pairing leave them unchanged; the window
    attention (which slots pair), the skip (which slot is the query) and the recurrence (how
    example k is weighted by its distance) all show in them.
        cosine: of all of G with one GD step's (1: the construction up to its step size)
        cosine_by_example: the same per example k (oldest first)
        step_by_example: η_k = j ⟨G_k, U⟩ / ⟨U, U⟩ with U = δ_ab δ_cd, the step size example k
            is learned with (equal for all k when the recurrence keeps them all, A = 1)
        step: their mean; gd1_step: the MSE-optimal one-step η at this context size (the gd1
            reference's)
        step_spread: min / max of step_by_example (1: uniform, as the construction); None
            unless every η_k > 0
        cubic: whether G read with half the step agrees (relative 1e-2): the predictor is a
            polynomial of degree ≤ 3 in these inputs and G its exact coefficients."""
    examples, outputs, _, features, _ = coefficients.shape
    unit = torch.einsum("ab,cd->abcd", torch.eye(outputs, dtype=torch.float64),
                        torch.eye(features, dtype=torch.float64)).flatten()
    per_example = coefficients.flatten(1)  # (j, N·N·f·f), float64 as gd_coefficients reads it
    unit_rows = unit.expand_as(per_example)
    cosine = torch.nn.functional.cosine_similarity(per_example.flatten(), unit_rows.flatten(),
                                                   dim=0)
    by_example = torch.nn.functional.cosine_similarity(per_example, unit_rows, dim=1)
    steps = examples * (per_example @ unit) / unit.dot(unit)
    largest = float(coefficients.abs().max())
    cubic = largest > 0 and float((coefficients - check).abs().max()) <= 1e-2 * largest
    return {"cosine": float(cosine), "cosine_by_example": by_example.tolist(),
            "step_by_example": steps.tolist(), "step": float(steps.mean()),
            "gd1_step": float(gd1_step),
            "step_spread": float(steps.min() / steps.max()) if steps.min() > 0 else None,
            "cubic": bool(cubic)}


# --- the paper's comparison measures between two predictors (002 Fig. 1B/2B) -----------------
Predictor = Callable[[Tensor], Tensor]


def masked_mean(values: Tensor, mask: Tensor) -> float | None:
    """The mean over the positions where mask is True; None where there are none."""
    return float(values[mask].mean()) if mask.any() else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


def input_sensitivities(predict: Predictor, inputs: Tensor, query: slice, mask: Tensor) -> Tensor:
    """∂ŷ_t/∂x_query,t (B, T, N, f) by autograd: the Jacobian of each prediction with respect to
    the query coordinates of the input at its own position; zero where mask is False. Sequences
    are independent, so one backward pass per (scored position, output) covers the batch."""
    inputs = inputs.detach().requires_grad_(True)
    with torch.enable_grad():
        prediction = predict(inputs)
        batch, length, n_outputs = prediction.shape
        jacobian = inputs.new_zeros(batch, length, n_outputs, query.stop - query.start)
        for t in torch.nonzero(mask.any(0)).flatten().tolist():
            for i in range(n_outputs):
                grad, = torch.autograd.grad(prediction[:, t, i].sum(), inputs, retain_graph=True)
                jacobian[:, t, i] = grad[:, t, query]
    return jacobian.detach() * mask[..., None, None]


def comparison_metrics(predict: Predictor, reference: Predictor, inputs: Tensor, targets: Tensor,
                       mask: Tensor, query: slice, batch_size: int | None = None
                       ) -> dict[str, float]:
    """Paper 002 Fig. 1-2 between a model and a reference predictor (e.g. a trained GD-SSM and
    one GD step), averaged over the scored positions: both losses (squared error averaged over
    target coordinates), the L2 distance of the predictions, and the cosine similarity and L2
    distance of the sensitivities ∂ŷ/∂x_query; the distances also relative to the reference's
    mean norm (the paper's axes have no scale of their own). None where undefined (no
    position with both sensitivities non-zero, a reference of norm 0). Predictors see at most
    `batch_size` sequences at a time."""
    size = batch_size or len(inputs)

    def in_batches(measure) -> Tensor:
        return torch.cat([measure(slice(i, i + size)) for i in range(0, len(inputs), size)])

    with torch.no_grad():
        ours = in_batches(lambda part: predict(inputs[part]))
        theirs = in_batches(lambda part: reference(inputs[part]))
    sens_ours, sens_theirs = (
        in_batches(lambda part: input_sensitivities(p, inputs[part], query, mask[part])).flatten(-2)
        for p in (predict, reference))
    # The cosine is undefined where a sensitivity vanishes (e.g. GD with no example yet).
    defined = mask & (sens_ours.norm(dim=-1) > 0) & (sens_theirs.norm(dim=-1) > 0)
    cosine = torch.nn.functional.cosine_similarity(sens_ours, sens_theirs, dim=-1)
    prediction_l2 = masked_mean((ours - theirs).norm(dim=-1), mask)
    sensitivity_l2 = masked_mean((sens_ours - sens_theirs).norm(dim=-1), mask)

    def interval(values: Tensor, over: Tensor, scale: Tensor | None = None) -> list | None:
        """The bootstrap interval over sequences of the mean of values where `over`, or of
        that mean relative to scale's mean there: a ratio of per-sequence sums."""
        if not over.any():
            return None
        denominator = scale if scale is not None else torch.ones_like(values)
        return ratio_interval(torch.where(over, values, 0.0).sum(1),
                              torch.where(over, denominator, 0.0).sum(1))

    return {
        "loss": masked_mean((ours - targets).pow(2).mean(-1), mask),
        "reference_loss": masked_mean((theirs - targets).pow(2).mean(-1), mask),
        "prediction_l2": prediction_l2,
        "prediction_l2_relative": ratio(prediction_l2, masked_mean(theirs.norm(dim=-1), mask)),
        "prediction_l2_relative_ci": interval((ours - theirs).norm(dim=-1), mask,
                                              theirs.norm(dim=-1)),
        "sensitivity_cosine": masked_mean(cosine, defined),
        "sensitivity_cosine_ci": interval(cosine, defined),
        "sensitivity_l2": sensitivity_l2,
        "sensitivity_l2_relative": ratio(sensitivity_l2,
                                         masked_mean(sens_theirs.norm(dim=-1), mask)),
        "sensitivity_l2_relative_ci": interval((sens_ours - sens_theirs).norm(dim=-1), mask,
                                               sens_theirs.norm(dim=-1)),
    }


class LinearRegression(LatentTask):
    family = "linreg"
    kind = "vectors"
    description = ("in-context linear regression, x ~ U(-1,1)^f, W ~ N(0, I), interleaved or "
                   "constructed-token prompts (paper 002 §4)")

    Config = LinRegConfig

    def __init__(self, config=None, **kwargs):
        super().__init__(config, **kwargs)
        self._step_sizes: dict[int, Tensor] = {}

    @property
    def n_examples(self) -> int:
        c = self.config
        return (c.seq_len + 1) // 2 if c.prompt == "interleaved" else c.seq_len

    def latent_floats(self) -> int:
        c = self.config  # the weights; prefix Gram matrices of the ridge and GD references
        return c.n_features * c.n_outputs + (c.seq_len + 1) * c.n_features * (c.n_features + 1)

    @property
    def input_dim(self) -> int:
        c = self.config
        if c.prompt == "interleaved":
            return c.n_features + c.n_outputs + 1
        return c.n_outputs * c.n_features + c.n_features

    @property
    def output_dim(self) -> int:
        return self.config.n_outputs

    # --- sampling ------------------------------------------------------------------------
    def draw_latent(self, n: int, generator: torch.Generator) -> dict[str, Tensor]:
        """The regression weights W ~ N(0, I), (n, N, f)."""
        c = self.config
        return {"weights": torch.randn(n, c.n_outputs, c.n_features, generator=generator,
                                       device=generator.device)}

    def sample_given(self, latent: dict[str, Tensor], generator: torch.Generator,
                     x_scale: float = 1.0) -> Batch:
        """Prompts for the given weights: x ~ U(-x_scale, x_scale)^f, y = W x + ε."""
        c = self.config
        weights = latent["weights"]
        n, device = weights.shape[0], generator.device
        x = torch.rand(n, self.n_examples, c.n_features, generator=generator, device=device) * 2 - 1
        x = x * x_scale
        # The noise is drawn even when σ = 0, so every σ sees the same x and W for a given seed.
        noise = torch.randn(n, self.n_examples, c.n_outputs, generator=generator, device=device)
        y = torch.einsum("bof,bkf->bko", weights, x) + c.noise_std * noise
        if c.prompt == "interleaved":
            inputs, targets, loss_mask = interleave(x, y, c.seq_len)
        else:
            inputs, targets = constructed_tokens(x, y), y
            loss_mask = torch.ones(n, c.seq_len, dtype=torch.bool, device=device)
        if c.score == "last":
            loss_mask = last_scored(loss_mask)
        return Batch(inputs, targets, loss_mask, {"weights": weights})

    def held_out(self, n: int, split: int = TEST_STREAM) -> Batch:
        """The fixed evaluation set: W from the prior, inputs x ~ U(-α, α)^f with α =
        eval_x_scale (1: the training distribution). Same draws for every α, so the set at α is
        the set at 1 with every x multiplied by α (and y recomputed from it)."""
        generator = make_generator(split, 0)
        return self.sample_given(self.draw_latent(n, generator), generator,
                                 self.config.eval_x_scale)

    @property
    def held_out_from_prior(self) -> bool:
        """True whatever eval_x_scale: the Bayes reference stays exact on scaled inputs (see the
        module docstring), so a model beating it is still a bug."""
        return True

    # --- what the references see ---------------------------------------------------------
    def examples(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """x (B, n, f) and y (B, n, N) in float64, read from the inputs; the y of the last example,
        which no input shows, is 0 (no causal prediction can use it).

        Constructed tokens show y_k only inside vec(y_k x_kᵀ); it is recovered by projecting on x_k
        (shown one position earlier). Summing the products directly would make S_xy inconsistent
        with S_xx by their float32 rounding, which a noiseless least-squares fit at j ≈ f amplifies
        by 1/λ_min(S_xx) instead of 1/√λ_min(S_xx)."""
        return self.examples_of(batch.inputs)

    def examples_of(self, inputs: Tensor) -> tuple[Tensor, Tensor]:
        """`examples` of prompts (B, T, d); differentiable in the inputs."""
        c = self.config
        inputs = inputs.to(torch.float64)
        if c.prompt == "interleaved":
            return split_interleaved(inputs, c.n_features, c.n_outputs)
        split = c.n_outputs * c.n_features
        x = inputs[..., split:]
        products = inputs[:, 1:, :split].unflatten(-1, (c.n_outputs, c.n_features))
        earlier = x[:, :-1]
        norm = earlier.pow(2).sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
        y = (products @ earlier.unsqueeze(-1)).squeeze(-1) / norm
        return x, torch.cat([y, y.new_zeros(y.shape[0], 1, c.n_outputs)], dim=1)

    def prefix_statistics(self, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        """S_xx (B, n, f, f), S_xy (B, n, f, N) over the examples before each query, and the
        queries x_j (B, n, f); float64, read from the inputs only."""
        x, y = self.examples(batch)
        xx = exclusive_cumsum(x.unsqueeze(-1) * x.unsqueeze(-2))
        xy = exclusive_cumsum(x.unsqueeze(-1) * y.unsqueeze(-2))
        return xx, xy, x

    def example_targets(self, batch: Batch) -> Tensor:
        """y_j for every query, (B, n, N)."""
        if self.config.prompt == "interleaved":
            return batch.targets[:, 0::2]
        return batch.targets

    def _positions(self, per_example: Tensor) -> Tensor:
        if self.config.prompt == "interleaved":
            return to_positions(per_example, self.config.seq_len)
        return per_example

    def _filtered(self, batch: Batch, response) -> Tensor:
        xx, xy, query = self.prefix_statistics(batch)
        return self._positions(filtered_prediction(xx, xy, query, response))

    # --- step sizes of gradient descent --------------------------------------------------
    def step_sizes(self, steps: int) -> Tensor:
        """η_{K,j} for context sizes j = 0 .. n-1 (closed form for K = 1, else tuned and cached)."""
        if steps not in self._step_sizes:
            context = torch.arange(self.n_examples)
            if steps == 1:
                self._step_sizes[steps] = gd1_step_size(context, self.config.n_features,
                                                        self.config.noise_std)
            else:
                self._step_sizes[steps] = self.tune_step_sizes(steps)
        return self._step_sizes[steps]

    def tune_step_sizes(self, steps: int, tasks: int = TUNING_TASKS) -> Tensor:
        """Minimise the empirical risk of K-step GD over η, for every context size j at once, on a
        fixed sample: a log-spaced scan over [1e-3, 1e3] brackets the minimum, then golden-section
        search on log η refines it inside the bracket. With 4096 tasks the step's Monte-Carlo error
        is ~2-5% (K = 1 is checked against the closed form), which costs only a second-order
        excess risk."""
        batch = self.sample(tasks, make_generator(TUNING_STREAM, 0))
        xx, xy, query = self.prefix_statistics(batch)
        target = self.example_targets(batch).to(torch.float64)
        eigenvalues, vectors = torch.linalg.eigh(xx)
        along_query = (vectors.transpose(-1, -2) @ query.unsqueeze(-1)).squeeze(-1)
        paired = along_query.unsqueeze(-1) * (vectors.transpose(-1, -2) @ xy)  # (B, n, f, N)
        context = torch.arange(self.n_examples, dtype=torch.float64)

        def risk(log_eta: Tensor) -> Tensor:  # (n,) -> (n,)
            rate = torch.where(context > 0, log_eta.exp() / context.clamp_min(1), 0.0)
            h = gd_response(steps, rate)(eigenvalues)
            prediction = (h.unsqueeze(-1) * paired).sum(-2)
            return (prediction - target).pow(2).mean((0, 2))

        grid = torch.linspace(math.log(1e-3), math.log(1e3), 33, dtype=torch.float64)
        scan = torch.stack([risk(g.expand(self.n_examples)) for g in grid])
        scan = torch.nan_to_num(scan, nan=math.inf)
        best = scan.argmin(0)
        low = grid[(best - 1).clamp_min(0)]
        high = grid[(best + 1).clamp_max(len(grid) - 1)]
        ratio = (math.sqrt(5) - 1) / 2
        for _ in range(35):  # shrinks the bracket (0.86 in log η) by 0.618^35 ≈ 5e-8
            left, right = high - ratio * (high - low), low + ratio * (high - low)
            go_left = risk(left) < risk(right)
            high = torch.where(go_left, right, high)
            low = torch.where(go_left, low, left)
        return torch.where(context > 0, ((low + high) / 2).exp(), 0.0)

    # --- references ----------------------------------------------------------------------
    def references(self) -> dict[str, Reference]:
        c = self.config
        context = torch.arange(self.n_examples, dtype=torch.float64)
        noise_var = c.noise_std ** 2
        bayes_response = ridge_response(noise_var) if noise_var > 0 else pinv_response
        refs = {
            "bayes": Reference(
                "bayes", "bayes",
                "posterior mean of W: ridge with λ = σ² (σ = 0: minimum-norm least squares)",
                lambda batch: self._filtered(batch, bayes_response)),
            "ols": Reference(
                "ols", "baseline", "minimum-norm least squares on the context examples",
                lambda batch: self._filtered(batch, pinv_response)),
        }
        for steps in sorted(set(c.gd_steps)):
            def predict(batch: Batch, steps: int = steps) -> Tensor:
                rate = torch.where(context > 0, self.step_sizes(steps) / context.clamp_min(1), 0.0)
                return self._filtered(batch, gd_response(steps, rate))
            how = "closed-form" if steps == 1 else "numerically tuned"
            refs[f"gd{steps}"] = Reference(
                f"gd{steps}", "baseline",
                f"{steps} step(s) of GD from W = 0, {how} MSE-optimal step per context size",
                predict)
        refs["oracle"] = Reference(
            "oracle", "bound", "the true W applied to the query (noise floor σ²)",
            self._oracle)
        refs["zero"] = Reference(
            "zero", "baseline", "predicts 0, the prior mean of y: no in-context learning",
            lambda batch: torch.zeros(batch.targets.shape, dtype=torch.float64))
        return refs

    # --- the learned update, read off the predictor (paper 002 §4.2, Fig. 3) ---------------
    @torch.no_grad()
    def gd_coefficients(self, predict, batch_size: int, step: float = 1.0) -> Tensor:
        """G (j, N, N, f, f): G[k, a, b, c, d] is the coefficient of y_{k,b} x_{k,c} x_{q,d} in the
        prediction ŷ_a for the final query x_q (j = n - 1 examples before it), read at the empty
        interleaved prompt (every x, y zero; x-flags 1) by the mixed third difference
            G = Σ_{S ⊆ {y_{k,b}, x_{k,c}, x_{q,d}}} (-1)^{3-|S|} ŷ_a(those in S set to `step`) / step³.
        For a predictor that is a polynomial of degree ≤ 3 in its inputs (one GD-SSM layer: its
        state is a sum of key-value products, read by a query, all affine in the tokens) every
        other monomial cancels, so this is the coefficient exactly, whatever the step. `predict`
        maps prompts (B, T, f + N + 1) to predictions (B, T, N), batch_size prompts at a time."""
        c = self.config
        features, outputs = c.n_features, c.n_outputs
        query = self.n_examples - 1
        length = 2 * query + 1  # up to the query: a causal prediction ignores what follows
        subsets = torch.tensor([[(s >> i) & 1 for i in range(3)] for s in range(8)],
                               dtype=torch.float32)  # (8, 3): which of y, x, x_q is set
        signs = (-1.0) ** (3 - subsets.sum(1, dtype=torch.float64))
        b, cc, d = (index.flatten() for index in torch.meshgrid(
            torch.arange(outputs), torch.arange(features), torch.arange(features), indexing="ij"))
        triples = len(b)
        rows, sets = torch.arange(triples)[:, None], torch.arange(8)[None, :]
        base = torch.zeros(length, self.input_dim)
        base[0::2, -1] = 1.0
        coefficients = []
        for k in range(query):
            prompts = base.repeat(triples, 8, 1, 1)  # (triples, 8, T, D)
            prompts[rows, sets, 2 * k + 1, features + b[:, None]] = step * subsets[:, 0]
            prompts[rows, sets, 2 * k, cc[:, None]] = step * subsets[:, 1]
            prompts[rows, sets, 2 * query, d[:, None]] = step * subsets[:, 2]
            flat = prompts.flatten(0, 1)
            out = torch.cat([predict(flat[i:i + batch_size])[:, 2 * query]
                             for i in range(0, len(flat), batch_size)])
            difference = (signs[None, :, None] * out.view(triples, 8, outputs).double()).sum(1)
            # (b, c, d, a) -> (a, b, c, d)
            coefficients.append((difference / step ** 3).view(outputs, features, features, outputs)
                                .permute(3, 0, 1, 2))
        return torch.stack(coefficients)

    def summarize_predictor(self, predict, batch_size: int) -> dict:
        """metrics.probe: `gd_comparison` (paper 002 Fig. 1B/2B) against one GD step, and
        `gd_match` (Fig. 3) on interleaved prompts with at least one example before the final
        query; gd_match is left out for constructed tokens, or where reading G would take more
        than GD_MATCH_MAX_TOKENS prompt tokens (16 j N f² prompts of 2j + 1 tokens: e.g.
        N = f = 20 with 20 examples)."""
        c = self.config
        summary = self.gd_comparison(predict, batch_size)
        if c.prompt != "interleaved" or self.n_examples < 2:
            return summary
        query = self.n_examples - 1
        if 16 * query * c.n_outputs * c.n_features ** 2 * (2 * query + 1) > GD_MATCH_MAX_TOKENS:
            return summary
        coefficients = self.gd_coefficients(predict, batch_size)
        check = self.gd_coefficients(predict, batch_size, step=0.5)
        summary["gd_match"] = gd_match(coefficients, check, float(self.step_sizes(1)[query]))
        return summary

    def query_coordinates(self) -> slice:
        """Where the query x sits in the input vector at its own (scored) position."""
        f = self.config.n_features
        return slice(0, f) if self.config.prompt == "interleaved" else slice(
            self.input_dim - f, self.input_dim)

    def gd1_on_prompts(self, inputs: Tensor) -> Tensor:
        """The gd1 reference as a function of the prompt alone, differentiable in it:
        ŷ_j = (η_j/j) Σ_{k<j} y_k x_kᵀ x_j (one GD step from W = 0, h(e) = η/j needs no
        eigen-decomposition, whose gradient is undefined at the repeated zero eigenvalues of
        S_xx for j < f)."""
        x, y = self.examples_of(inputs)
        context = torch.arange(self.n_examples, dtype=torch.float64, device=x.device)
        rate = self.step_sizes(1).to(x) / context.clamp_min(1)
        xy = exclusive_cumsum(x.unsqueeze(-1) * y.unsqueeze(-2))  # (B, n, f, N)
        prediction = rate[:, None] * (xy * x.unsqueeze(-1)).sum(-2)
        return self._positions(prediction)

    def gd_comparison(self, predict, batch_size: int) -> dict:
        """metrics.probe.gd_comparison: `comparison_metrics` of the model against `gd1_on_prompts`
        on the first COMPARISON_PROMPTS held-out prompts at their scored positions (every query,
        or the final one with score=last), in batches of `batch_size`; {} where that would take
        more than COMPARISON_MAX_PASSES backward passes (scored positions × outputs)."""
        batch = self.held_out(COMPARISON_PROMPTS)
        passes = int(batch.loss_mask.any(0).sum()) * self.config.n_outputs
        if passes > COMPARISON_MAX_PASSES:
            return {}
        summary = comparison_metrics(predict, self.gd1_on_prompts, batch.inputs, batch.targets,
                                     batch.loss_mask, self.query_coordinates(), batch_size)
        return {"gd_comparison": {**summary, "prompts": len(batch)}}

    def _oracle(self, batch: Batch) -> Tensor:
        query, _ = self.examples(batch)
        weights = batch.latent["weights"].to(torch.float64)
        return self._positions(torch.einsum("bof,bkf->bko", weights, query))
