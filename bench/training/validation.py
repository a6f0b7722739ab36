"""Live validation (trainer.val_every): the run's headline on a fixed set of validation
sequences every N steps, scored as the final evaluation scores."""
from __future__ import annotations

import math

import lightning as L
import torch

from bench.config import TrainerConfig
from bench.training.evaluate import ReferenceScores, reference_scores, score_predictions
from bench.training.module import ICLModule, scoring_inputs
from bench.training.runlog import RunLog, headline
from tasks.base import VAL_STREAM, Batch, Task


def validation_set(task: Task, n: int) -> Batch:
    """The live validation's n held-out sequences, fixed for the run: drawn as the final
    evaluation's held-out set is (Task.held_out: the same distribution, eval_x_scale or the
    held-out simplex region included) but from the validation stream, so they are not the
    sequences the final evaluation scores. A task whose data decides its held-out set (text:
    the evaluation split's windows) gives n of those windows, evenly spaced over the split."""
    batch = task.held_out(n, VAL_STREAM)
    if len(batch) > n:
        batch = batch.select(torch.linspace(0, len(batch) - 1, n).round().long())
    return batch


class LiveValidation(L.Callback):
    """trainer.val_every: every N optimizer steps and at the last one, the run's headline (the
    Bayes gap; text: nats/token) on the fixed validation_set of trainer.val_sequences sequences,
    scored as the final evaluation scores (ICLModule.held_out_outputs, score_predictions): a row
    `val/...` in the training log (headline()) and [step, value] in the record's
    train.val_curve, the step counting optimizer steps done (N, 2N, ..., max_steps).

    Between steps: when the batch of step s (s optimizer steps done) starts, and when training
    ends, never inside training_step (which reads nothing back between its checks). So a
    checkpoint of step s holds the points before s and the run resumed from it scores s itself,
    as the loss curve and the log go on (RunLog). In eval mode without gradients, under the
    training precision, with the random state forked and no training batch drawn, so a run's
    result is bit for bit the same with or without validation.

    Under DDP rank 0 alone validates, on its own replica (module.model, not the DDP wrapper),
    with no collective inside: the other ranks go on and wait for it in the next step's gradient
    all-reduce. Sharding a few dozen sequences over the ranks would save little and need a
    gather that every rank must reach; the record and the log are rank 0's anyway."""

    def __init__(self, config: TrainerConfig, run_log: RunLog | None):
        self.config, self.run_log = config, run_log
        self.sequences: Batch | None = None
        self.references: ReferenceScores | None = None

    def on_train_start(self, trainer: L.Trainer, module: ICLModule) -> None:
        if not trainer.is_global_zero:
            return
        task = module.task
        with torch.random.fork_rng(devices=self._rng_devices(module)):
            self.sequences = validation_set(task, self.config.val_sequences)
            # a text model's nats/token need no reference; a gap needs every reference's scores
            # (the task's summary of them is part of scoring), computed once, here
            self.references = (reference_scores(task, self.sequences) if task.scoring == "gap"
                               else ReferenceScores({}, None))

    def on_train_batch_start(self, trainer: L.Trainer, module: ICLModule, batch,
                             batch_idx: int) -> None:
        step = int(trainer.global_step)  # optimizer steps done, this batch's still to come
        if step > 0 and step % self.config.val_every == 0 and module.micro_index == 0:
            self.validate_at(step, trainer, module)

    def on_train_end(self, trainer: L.Trainer, module: ICLModule) -> None:
        step = int(trainer.global_step)  # the last step
        if not module.val_curve or module.val_curve[-1][0] != step:
            self.validate_at(step, trainer, module)

    def validate_at(self, step: int, trainer: L.Trainer, module: ICLModule) -> None:
        if not trainer.is_global_zero:
            return
        values = headline(self.validate(trainer, module), "val")
        module.val_curve.append((step, next(iter(values.values()))))
        if self.run_log is not None:
            self.run_log.write(values, step)

    def validate(self, trainer: L.Trainer, module: ICLModule) -> dict:
        """The metrics of the validation set (score_predictions'), NaN where the model's
        outputs are not finite: a diverging run is stopped by its loss checks, not here."""
        model, size = module.model, self.config.eval_batch_size
        training = model.training
        model.eval()
        try:
            # eager, as the final evaluation (bench/training/train.py): no recompile for its batches
            with torch.no_grad(), torch.random.fork_rng(devices=self._rng_devices(module)), \
                    trainer.precision_plugin.forward_context(), \
                    torch.compiler.set_stance("force_eager"):
                parts = [module.held_out_outputs(
                    self.sequences.select(slice(start, start + size)).to(module.device))[0]
                    for start in range(0, len(self.sequences), size)]
        finally:
            model.train(training)
        predictions, scores = scoring_inputs(
            module.task, {name: torch.cat([part[name] for part in parts]) for name in parts[0]})
        try:
            return score_predictions(module.task, self.sequences, predictions,
                                     self.config.bootstrap, self.references, scores)["metrics"]
        except FloatingPointError:  # every number headline() reads, of either scoring, NaN
            nan, model = math.nan, {"model": math.nan}
            return {"scoring": module.task.scoring, "loss": model, "perplexity": model,
                    "loss_ci": {"model": [nan, nan]}, "bayes_gap": nan,
                    "bayes_gap_ci": [nan, nan], "relative_gap": nan}

    @staticmethod
    def _rng_devices(module: ICLModule) -> list:
        return [module.device] if module.device.type == "cuda" else []
