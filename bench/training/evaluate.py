"""Score a model and the task's references on the fixed held-out set.

Everything is paired: the model and every reference predict the same sequences, so the Bayes
gap of a sequence is the difference of two losses on it, and its confidence interval is a
bootstrap over sequences of those differences."""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from bench.training.cross_entropy import chunked_cross_entropy, uses_chunks
from tasks.base import Batch, Task
from tasks.stats import (band_sequence_means, bootstrap_ci, position_means, position_stderrs,
                         ratio_interval, sequence_means)


def token_score_chunks(n: int, seq_len: int, vocab: int, floats: int = 1 << 28) -> list[slice]:
    """Row slices of an evaluation batch whose logits hold at most `floats` floats (~1 GiB in
    float32): a 50k-token vocabulary at T = 256 is 13M floats per sequence."""
    rows = max(1, floats // max(1, seq_len * vocab))
    return [slice(start, start + rows) for start in range(0, n, rows)]


def token_scores(model, batch: Batch, vocab: int) -> tuple[Tensor, Tensor, torch.dtype]:
    """The model's per-position loss (float32) and top-1 hits on batch, computed where the model
    is, a chunk of rows at a time; and the dtype its predictions came in."""
    losses, hits = [], []
    for rows in token_score_chunks(len(batch), batch.inputs.shape[1], vocab):
        prediction = model.predict(batch.inputs[rows])
        targets = batch.targets[rows]
        losses.append(-prediction.float().gather(-1, targets.unsqueeze(-1)).squeeze(-1))
        hits.append(prediction.argmax(-1) == targets)
    return torch.cat(losses), torch.cat(hits), prediction.dtype


def gap_reference(task: Task) -> str:
    """The reference a model's gap is measured against: the exact Bayes predictor, or, for a
    task that has none, its clairvoyant bound (the record says which)."""
    refs = task.references()
    for role in ("bayes", "bound"):
        for name, ref in refs.items():
            if ref.role == role:
                return name
    raise ValueError(f"task {task.family} has neither a bayes nor a bound reference")


def position_scores(task: Task, batch: Batch, prediction: Tensor,
                    reference_probs: Tensor | None) -> dict[str, Tensor]:
    """Per-position scores (B, T) of one predictor, zero where nothing is scored: `loss`, and for
    tokens `correct` (top-1 hit) and `l1` (L1 distance to the gap reference's distribution
    `reference_probs`); for vectors `error` (B, T, d_out), the signed error prediction - target,
    for a task's summary of the errors' distribution (a loss has lost the sign), in float32:
    half the size of the float64 prediction it replaces, ample for a histogram. Everything later
    is a mean of these over positions and sequences, or a summary of them."""
    mask = batch.loss_mask.cpu().bool()
    targets = batch.targets.cpu()
    prediction = prediction.double().cpu()
    # where(), not a product: an infinite loss at an unscored position must not become NaN
    scores = {"loss": torch.where(mask, task.position_loss(prediction, targets), 0.0)}
    if task.kind == "tokens":
        scores["correct"] = (prediction.argmax(-1) == targets) & mask
        l1 = (prediction.exp() - reference_probs.double()).abs().sum(-1)
        scores["l1"] = torch.where(mask, l1, 0.0)
    else:
        scores["error"] = torch.where(mask[..., None], prediction - targets, 0.0).float()
    return scores


@dataclass
class ReferenceScores:
    """What scoring needs of the references on a held-out set: each one's per-position scores and,
    for tokens, the gap reference's distribution in float32 (for the model's L1 distance; float32
    is ample for a distance between probabilities). Cached on disk
    (bench/training/reference_cache.py): it is the same for every model."""

    scores: dict[str, dict[str, Tensor]]
    reference_probs: Tensor | None


def reference_scores(task: Task, batch: Batch) -> ReferenceScores:
    """Every reference's per-position scores on batch, computed from its predictions (or, for a
    reference that gives per-position losses only, those)."""
    refs = task.references()
    if task.scoring == "perplexity":
        mask = batch.loss_mask.cpu().bool()
        return ReferenceScores({name: {"loss": torch.where(mask, ref.loss(batch).double().cpu(), 0.0)}
                                for name, ref in refs.items()}, None)
    reference = gap_reference(task)
    best = refs[reference].predict(batch).double().cpu()
    probs = best.exp() if task.kind == "tokens" else None
    scores = {name: position_scores(task, batch, best if name == reference
                                    else ref.predict(batch), probs)
              for name, ref in refs.items()}
    return ReferenceScores(scores, probs.float() if probs is not None else None)


def score(task: Task, batch: Batch, predictions: dict[str, Tensor], resamples: int) -> dict:
    """Metrics of every predictor in `predictions` (the references, and optionally "model")."""
    reference = gap_reference(task)
    probs = predictions[reference].double().exp() if task.kind == "tokens" else None
    return score_positions(task, batch, {name: position_scores(task, batch, pred, probs)
                                         for name, pred in predictions.items()}, resamples)


def score_positions(task: Task, batch: Batch, scores: dict[str, dict[str, Tensor]],
                    resamples: int) -> dict:
    """Metrics of every predictor from its per-position scores (see position_scores)."""
    if task.scoring == "perplexity":
        return score_perplexity(task, batch, scores, resamples)
    mask = batch.loss_mask.cpu().double()
    losses = {name: s["loss"] for name, s in scores.items()}
    per_sequence = {name: sequence_means(loss, mask) for name, loss in losses.items()}
    reference = gap_reference(task)
    roles = {name: ref.role for name, ref in task.references().items()}
    best = per_sequence[reference]
    metrics: dict = {
        "gap_reference": reference,
        "gap_reference_role": roles[reference],
        "held_out_from_prior": task.held_out_from_prior,
        "loss": {name: float(v.mean()) for name, v in per_sequence.items()},
        "loss_ci": {name: bootstrap_ci(v, resamples) for name, v in per_sequence.items()},
        "gap": {name: float((v - best).mean()) for name, v in per_sequence.items()},
        "gap_ci": {name: bootstrap_ci(v - best, resamples) for name, v in per_sequence.items()},
        "roles": roles,
    }
    positions = {f"loss.{name}": loss for name, loss in losses.items()}
    positions.update({f"gap.{name}": loss - losses[reference]
                      for name, loss in losses.items() if name != reference})
    if task.kind == "tokens":
        for name in ("accuracy", "l1_to_reference"):
            metrics[name], metrics[f"{name}_ci"] = {}, {}
        for name, s in scores.items():
            correct = s["correct"].double()
            for metric, values in (("accuracy", correct), ("l1_to_reference", s["l1"])):
                means = sequence_means(values, mask)
                metrics[metric][name] = float(means.mean())
                metrics[f"{metric}_ci"][name] = bootstrap_ci(means, resamples)
            positions[f"accuracy.{name}"] = correct
    if "model" in per_sequence:
        metrics["bayes_gap"] = metrics["gap"]["model"]
        metrics["bayes_gap_ci"] = metrics["gap_ci"]["model"]
        metrics["relative_gap"] = metrics["bayes_gap"] / abs(metrics["loss"][reference])
        # the ratio's own interval: the same bootstrap over sequences, numerator and denominator
        # resampled together
        metrics["relative_gap_ci"] = ratio_interval(per_sequence["model"] - best, best.abs(),
                                                    resamples)
        if task.kind == "tokens":
            metrics["l1_to_bayes"] = metrics["l1_to_reference"]["model"]
    metrics["held_out_digest"] = held_out_digest(batch)
    # each curve's standard error by position, which a claim on one position or a slice of
    # them reads (bench/reports/claims/verdicts.py)
    result = {"metrics": metrics,
              "per_position": {k: position_means(v, mask) for k, v in positions.items()},
              "per_position_stderr": {k: position_stderrs(v, mask) for k, v in positions.items()}}
    if "model" in per_sequence:
        lo, hi = metrics["bayes_gap_ci"]
        metrics["gap_excludes_zero"] = lo > 0 or hi < 0
        metrics["gap_closed"] = gap_closed(metrics["gap"], roles)
        bands = context_bands(mask.shape[1])
        model_bands = [band_sequence_means(losses["model"], mask, band) for band in bands]
        gap_bands = [band_sequence_means(losses["model"] - losses[reference], mask, band)
                     for band in bands]
        metrics["gap_by_band"] = [
            {"positions": band, "sequences": int(scored.sum()),
             "gap": float(gaps[scored].mean()) if scored.any() else None}
            for band, (gaps, scored) in zip(bands, gap_bands)]
        # what `python -m bench compare` pairs with another run on the same held-out set, and
        # claims pair within a record (the model against a reference on the same sequences)
        result["per_sequence"] = {
            "bands": bands,
            "loss": {name: rounded(values) for name, values in per_sequence.items()},
            "band_loss": {"model": [rounded(means, scored) for means, scored in model_bands]}}
    metrics["task"] = task.summarize(batch, {n: l.detach() for n, l in losses.items()}, scores)
    if "per_sequence" in result and (sequences := task.summarize_sequences(batch, scores)):
        result["per_sequence"]["task"] = recorded_sequences(sequences, len(batch))
    return result


def recorded_sequences(tree: dict, n: int) -> dict:
    """summarize_sequences' values as a record keeps them: each tensor of n per-sequence values
    rounded as the per-sequence losses are (`rounded`), plain numbers as they are."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out[key] = recorded_sequences(value, n)
        elif isinstance(value, Tensor):
            if value.shape != (n,):
                raise ValueError(f"summarize_sequences: '{key}' has shape {tuple(value.shape)}, "
                                 f"not one value per held-out sequence ({n})")
            out[key] = rounded(value.double())
        else:
            out[key] = value
    return out


# 1-based positions where the context-length bands of gap_by_band begin: models whose
# full-sequence averages agree often differ on the first few positions, where in-context
# learning has least to go on.
BAND_STARTS = (1, 9, 65)
RECORD_DIGITS = 7  # significant digits of the per-sequence losses in a record


def context_bands(seq_len: int) -> list[list[int]]:
    """[first, last] positions (1-based, inclusive) of each band that fits in seq_len."""
    ends = [start - 1 for start in BAND_STARTS[1:]] + [seq_len]
    return [[start, min(end, seq_len)] for start, end in zip(BAND_STARTS, ends)
            if start <= seq_len]


def rounded(values: Tensor, present: Tensor | None = None) -> list[float | None]:
    """values as a JSON list at RECORD_DIGITS significant digits (None where not present): ample
    for a paired difference of means, and a third of the bytes of a float's full repr."""
    keep = present.tolist() if present is not None else [True] * len(values)
    return [float(f"{v:.{RECORD_DIGITS}g}") if k else None for v, k in zip(values.tolist(), keep)]


def content_digest(value) -> str:
    """sha256 of nested dicts/lists of tensors: every tensor's name path, dtype, shape and bytes."""
    digest = hashlib.sha256()

    def visit(item, where: str) -> None:
        if isinstance(item, dict):
            for key in sorted(item, key=str):
                visit(item[key], f"{where}/{key}")
        elif isinstance(item, (list, tuple)):
            for i, element in enumerate(item):
                visit(element, f"{where}/{i}")
        elif isinstance(item, Tensor):
            flat = item.detach().cpu().contiguous().reshape(-1)
            digest.update(f"{where}:{flat.dtype}:{tuple(item.shape)}".encode())
            digest.update(flat.view(torch.uint8).numpy().tobytes())
        else:
            digest.update(f"{where}={item!r}".encode())

    visit(value, "")
    return digest.hexdigest()


def masked_loss(task: Task, output: Tensor, batch: Batch) -> Tensor:
    """Mean training loss over the scored positions: cross-entropy of logits, or squared error
    averaged over the target's coordinates. Every position is computed and the unscored ones
    are zeroed (`where`, sums): boolean-mask indexing would have a data-dependent shape, a host
    synchronisation on every step. In at least float32 (the logits of bf16 autocast; a language
    model's in chunks, bench/training/cross_entropy.py)."""
    mask = batch.loss_mask
    dtype = torch.promote_types(output.dtype, torch.float32)
    if task.kind == "tokens":
        logits, targets = output.flatten(0, -2), batch.targets.flatten()
        if uses_chunks(logits):  # a language model's: no float32 copy of them all
            per_position = chunked_cross_entropy(logits, targets).view_as(mask)
        else:
            per_position = torch.nn.functional.cross_entropy(
                logits.to(dtype), targets, reduction="none").view_as(mask)
    else:
        per_position = (output.to(dtype) - batch.targets.to(dtype)).pow(2).mean(-1)
    return torch.where(mask, per_position, 0).sum() / mask.sum()


def held_out_digest(batch: Batch) -> str:
    """sha256 of the held-out inputs, targets and mask: two records with the same digest scored
    the same sequences, so their per-sequence losses pair."""
    return content_digest({"inputs": batch.inputs, "targets": batch.targets,
                           "loss_mask": batch.loss_mask})


def gap_closed(gaps: dict[str, float], roles: dict[str, str]) -> dict | None:
    """The share of the best baseline's gap that the model closes, 1 − gap(model) / gap(best),
    where best is the reference of role `baseline` with the smallest finite gap (the Bayes
    predictor, bounds and the Bayes estimate's Monte Carlo replicates are not baselines). None
    when the task has no such baseline; the fraction is None when that baseline's gap is not
    positive: there is no gap to close."""
    baselines = {name: gap for name, gap in gaps.items()
                 if roles.get(name) == "baseline" and gap is not None and math.isfinite(gap)}
    if not baselines:
        return None
    best = min(baselines, key=baselines.get)
    fraction = 1 - gaps["model"] / baselines[best] if baselines[best] > 0 else None
    return {"baseline": best, "gap": baselines[best], "fraction": fraction}


def score_perplexity(task: Task, batch: Batch, scores: dict[str, dict[str, Tensor]],
                     resamples: int) -> dict:
    """Metrics of a task without a Bayes predictor (text): per predictor, nats per scored token
    (a per-token mean over the whole held-out set, as perplexity is defined), perplexity = its
    exp, bits per UTF-8 byte, 95% bootstrap intervals over windows, the per-position loss curve;
    top-1 accuracy where a predictor's scores have it (the model's)."""
    mask = batch.loss_mask.cpu().double()
    counts = mask.sum(1)
    bytes_per_token = task.bytes_per_token()
    metrics: dict = {"scoring": "perplexity", "gap_reference": None,
                     "held_out_from_prior": task.held_out_from_prior,
                     "roles": {name: ref.role for name, ref in task.references().items()},
                     "loss": {}, "loss_ci": {}, "perplexity": {}, "perplexity_ci": {},
                     "bits_per_byte": {}, "accuracy": {}, "bytes_per_token": bytes_per_token}
    curves = {}
    for name, s in scores.items():
        sums = s["loss"].sum(1)
        nats = float(sums.sum() / counts.sum())
        lo, hi = bootstrap_ci(sums, resamples, weights=counts)
        metrics["loss"][name], metrics["loss_ci"][name] = nats, [lo, hi]
        metrics["perplexity"][name] = math.exp(nats)
        metrics["perplexity_ci"][name] = [math.exp(lo), math.exp(hi)]
        metrics["bits_per_byte"][name] = nats / math.log(2) / bytes_per_token
        curves[f"loss.{name}"] = position_means(s["loss"], mask)
        if "correct" in s:
            metrics["accuracy"][name] = float((s["correct"].double() * mask).sum() / counts.sum())
    metrics["task"] = task.summarize(batch, {n: s["loss"] for n, s in scores.items()}, scores)
    metrics["held_out_digest"] = held_out_digest(batch)
    # what claims pair between records of one held-out set: a per-token mean is a ratio of two
    # means over the windows, sum(loss_sum) / sum(tokens), resampled together
    per_sequence = {"tokens": [int(c) for c in counts.tolist()],
                    "loss_sum": {name: rounded(s["loss"].double().sum(1))
                                 for name, s in scores.items()}}
    return {"metrics": metrics, "per_position": curves, "per_sequence": per_sequence}


def score_predictions(task: Task, batch: Batch, model: Tensor | None, resamples: int,
                      references: ReferenceScores | None = None,
                      model_scores: dict[str, Tensor] | None = None) -> dict:
    """Held-out metrics of the model on batch (if given: its predictions, or for a perplexity
    task its per-position `model_scores`) and of every reference (`references`: their scores
    when already known, e.g. from the cache)."""
    references = references if references is not None else reference_scores(task, batch)
    scores = dict(references.scores)
    if model_scores is not None:
        if not torch.isfinite(model_scores["loss"]).all():
            raise FloatingPointError("the model's held-out losses are not finite")
        mask = batch.loss_mask.cpu().bool()
        scores["model"] = {"loss": torch.where(mask, model_scores["loss"], 0.0),
                           "correct": model_scores["correct"] & mask}
    if model is not None:
        if model.shape[:2] != batch.targets.shape[:2]:
            raise ValueError(f"model predictions of shape {tuple(model.shape)} for a held-out "
                             f"set of {tuple(batch.targets.shape)}")
        if not torch.isfinite(model).all():
            raise FloatingPointError("the model's held-out predictions are not finite")
        scores["model"] = position_scores(task, batch, model, references.reference_probs)
    result = score_positions(task, batch, scores, resamples)
    result["metrics"]["sequences"] = len(batch)
    result["metrics"]["scored_positions"] = int(batch.loss_mask.sum())
    return result


def probe_summary(task: Task, model, batch: Batch, batch_size: int) -> dict | None:
    """The record's metrics.probe: the task's summary (Task.summarize_probes) of the probes it
    asks for (Task.probes) that the model exposes (Backbone.probe), computed on the held-out
    inputs in batches where the model is, and its measures of the predictor as a function
    (Task.summarize_predictor, handed a predictor that autograd can differentiate in its
    inputs); None when there are neither."""
    device = next(model.parameters()).device
    summary = {}
    if task.probes and hasattr(model, "probe"):
        summary.update(summarize_model_probes(task, model, batch, batch_size, device))

    def predict(inputs: Tensor) -> Tensor:
        return model.predict(inputs.to(device)).float().cpu()

    training = model.training
    model.eval()  # once for all of the task's calls, then as it was
    try:
        summary.update(task.summarize_predictor(predict, batch_size))
    finally:
        model.train(training)
    return summary or None


@torch.no_grad()
def summarize_model_probes(task: Task, model, batch: Batch, batch_size: int, device) -> dict:
    """Task.summarize_probes of the model's probes on the held-out inputs, in batches."""
    parts = []
    for start in range(0, len(batch), batch_size):
        found = model.probe(batch.inputs[start:start + batch_size].to(device))
        parts.append({name: found[name].float().cpu() for name in task.probes if name in found})
    if not parts or not parts[0]:
        return {}
    probes = {name: torch.cat([part[name] for part in parts]) for name in parts[0]}
    return task.summarize_probes(batch, probes)
