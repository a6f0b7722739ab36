"""The LightningModule: the training step for any (model, task) pair (a Backbone trained on
fresh batches the task samples on the device), its optimiser and learning-rate schedule, and the
held-out evaluation as Trainer.test runs it."""
from __future__ import annotations

import math
import sys
import time

import lightning as L
import torch
import torchmetrics
from torch import Tensor

from bench.config import TrainerConfig
from bench.records.store import CHECKPOINT_FORMAT, CHECKPOINT_KEY
from bench.training.evaluate import masked_loss, token_scores
from bench.training.signals import (Diverged, Interrupted, SignalGuard, agreed_signal,
                                    lifecycle_group)
from models.backbone import Backbone, is_recurrent
from tasks.base import Batch, Task

# Under 16-mixed, checks in a row with a non-finite loss before a run counts as diverged: an
# overflow is skipped by GradScaler (and the scale lowered); only a persistent NaN is fatal.
NONFINITE_PATIENCE = 3


def cosine_with_warmup(step: int, warmup: int, total: int, floor: float) -> float:
    """Learning-rate multiplier: linear warm-up, then cosine from 1 down to `floor`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


class ICLModule(L.LightningModule):
    """Trains a Backbone on fresh batches of a task (sampled on the device by the task).

    `run_info` (run_id and the task/model/trainer description) goes into every checkpoint with
    the loss curve and the training time so far, so a resumed run can report the whole run."""

    def __init__(self, model: Backbone, task: Task, config: TrainerConfig,
                 run_info: dict | None = None, signals: SignalGuard | None = None,
                 clock_start: float | None = None):
        super().__init__()
        self.model, self.task, self.config = model, task, config
        self.run_info = run_info or {}
        self.signals = signals
        self.clock_start = time.perf_counter() if clock_start is None else clock_start
        self.loss_curve: list[tuple[int, float]] = []
        self.val_curve: list[tuple[int, float]] = []  # (step, headline): LiveValidation's
        self.prior_train_time = 0.0  # training seconds of the run(s) this one resumes
        self.resumed: dict | None = None  # the checkpoint's metadata, when resumed
        self._nonfinite_checks = 0  # consecutive checks with a non-finite loss
        # the micro-batch of the optimizer step that runs next (trainer.accumulate_grad_batches
        # parts a step): 0 at a callback's batch start is a step's first, 0 at its batch end
        # means the step's last has run
        self.micro_index = 0
        self._step_loss: Tensor | None = None  # the sum of the step's micro-batch losses
        # perf_counter at fit start, train start and the end of this process's first training
        # batch (host time: a cold start's compile and autotune show there), for the record's
        # start-up breakdown (bench/training/train.py startup_times)
        self.marks: dict[str, float] = {}

    def train_time(self) -> float:
        return self.prior_train_time + time.perf_counter() - self.clock_start

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        loss = masked_loss(self.task, self.model(batch.inputs), batch)
        step = int(self.global_step)
        parts = self.config.accumulate_grad_batches
        if parts > 1:  # the step's loss is the mean of its parts' (Lightning scales each by 1/k)
            own = loss.detach()
            self._step_loss = own if self.micro_index == 0 else self._step_loss + own
            self.micro_index = (self.micro_index + 1) % parts
            if self.micro_index:
                return loss  # the step goes on: checks happen once it is whole
            step_loss = self._step_loss / parts
        else:
            step_loss = loss
        if step % self.config.log_every == 0 or step == self.config.max_steps - 1:
            self._check_step(step_loss, step)
        elif self.trainer.world_size == 1 and self.signals is not None \
                and self.signals.signum is not None:
            raise Interrupted(self.signals.signum)  # alone, a signal needs no agreement
        return loss

    def on_train_start(self) -> None:
        self.marks.setdefault("train_start", time.perf_counter())
        self.micro_index = 0  # a resumed run starts at a step's first micro-batch
        self.train_device = str(self.device)  # Lightning moves the model back to the CPU later
        if self.config.progress and self.trainer.is_global_zero and self.run_info.get("run_id"):
            # progress: training has begun (a cold GPU start can take minutes of imports and
            # kernel compilation before it)
            print(f"training started: {self.run_info['run_id']}, step {self.global_step} of "
                  f"{self.config.max_steps} on {self.device}", file=sys.stderr, flush=True)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if "first_batch_end" not in self.marks:  # once: this hook runs at every step
            self.marks["first_batch_end"] = time.perf_counter()

    def on_fit_start(self) -> None:
        self.marks.setdefault("fit_start", time.perf_counter())
        if self.trainer.world_size > 1:
            lifecycle_group()  # every rank creates it here, in the same order (a collective)

    def _check_step(self, loss: Tensor, step: int) -> None:
        """A logging step (and the last step): the one place a training step reads a value back
        from the device. Records the loss (the mean over ranks: each trained on its own batch)
        and stops every rank together if the loss is not finite on some rank, or a signal came
        to some rank (a rank that stopped alone would leave the others waiting in the gradient
        all-reduce). Between checks nothing is read back, so a diverged run stops within
        trainer.log_every steps. Under 16-mixed an overflow is GradScaler's to skip: the run
        stops when the loss is not finite at NONFINITE_PATIENCE checks in a row."""
        own = loss.detach().float()
        signalled = self.signals is not None and self.signals.signum is not None
        stats = torch.stack([own, (~torch.isfinite(own)).float(),
                             own.new_tensor(float(signalled))])
        world = self.trainer.world_size
        if world > 1:
            torch.distributed.all_reduce(stats)
        total, nonfinite, signals = stats.tolist()  # the host synchronisation of this step
        mean = total / world
        if step % self.config.log_every == 0:
            self.logged_loss = mean
            self.loss_curve.append((step, mean))
        self._nonfinite_checks = self._nonfinite_checks + 1 if nonfinite else 0
        patience = NONFINITE_PATIENCE if self.config.precision == "16-mixed" else 1
        if self._nonfinite_checks >= patience:
            value = float(own)
            value = value if not math.isfinite(value) else None  # None: another rank's loss
            if value is not None and step % self.config.log_every:
                self.loss_curve.append((step, value))  # the record shows what stopped it
            raise Diverged(step, value)
        if signals:
            raise Interrupted(agreed_signal(self.signals.signum if signalled else None, world,
                                            own.device))

    # --- evaluation: Trainer.test on the training device, one shard of the held-out set per rank
    def on_test_epoch_start(self) -> None:
        # CatMetric gathers shards of unequal length from every rank when computed; NaNs are
        # kept (a non-finite prediction is reported, never dropped). Gap tasks gather the
        # predictions (scored on the CPU against the references' distributions); perplexity
        # tasks, whose predictions over a large vocabulary would not fit, gather per-position
        # scores computed here.
        fields = ("index", "prediction") if self.task.scoring == "gap" \
            else ("index", "loss", "correct")
        self.gathered = torch.nn.ModuleDict({
            name: torchmetrics.CatMetric(nan_strategy="disable")
            for name in fields}).to(self.device)

    def held_out_outputs(self, held_out: Batch) -> tuple[dict[str, Tensor], torch.dtype]:
        """What scoring needs of the model on held-out sequences (float32, where the model is),
        for the final evaluation and the live validation alike: its predictions, or for a
        perplexity task its per-position loss and top-1 hits; and the dtype it predicted in."""
        if self.task.scoring == "gap":
            prediction = self.model.predict(held_out.inputs)
            return {"prediction": prediction.float()}, prediction.dtype
        loss, correct, dtype = token_scores(self.model, held_out, self.task.output_dim)
        return {"loss": loss, "correct": correct.float()}, dtype

    def test_step(self, batch: tuple[Tensor, Batch], batch_idx: int) -> None:
        index, held_out = batch
        self.gathered["index"].update(index.float())  # float32 counts exactly up to 2^24
        outputs, dtype = self.held_out_outputs(held_out)  # under the training precision
        for name, value in outputs.items():
            self.gathered[name].update(value)
        self.eval_device = str(held_out.inputs.device)
        self.eval_dtype = str(dtype).removeprefix("torch.")

    def on_test_epoch_end(self) -> None:
        world = self.trainer.world_size
        if world > 1 and self.signals is not None:
            # Every rank reaches this once (unlike test_step: shards may differ by a batch), so
            # the ranks agree here whether a signal came to any of them during evaluation.
            flag = torch.tensor([float(self.signals.signum is not None)], device=self.device)
            torch.distributed.all_reduce(flag)
            if float(flag) > 0:
                raise Interrupted(agreed_signal(self.signals.signum, world, self.device))
        computed = {name: metric.compute() for name, metric in self.gathered.items()}
        order = computed.pop("index").long().argsort()
        self.test_predictions, self.test_scores = scoring_inputs(
            self.task, {name: value[order] for name, value in computed.items()})
        del self.gathered

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint[CHECKPOINT_KEY] = {
            "format": CHECKPOINT_FORMAT, **self.run_info,
            "loss_curve": [list(point) for point in self.loss_curve],
            "val_curve": [list(point) for point in self.val_curve],
            "train_wall_time_s": self.train_time()}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        meta = checkpoint.get(CHECKPOINT_KEY)
        if meta is None:  # run() validated the file; this is a checkpoint loaded by hand
            return
        # Steps from the checkpoint on are trained again by this run: keep only earlier ones.
        resume_step = int(checkpoint.get("global_step", 0))
        self.loss_curve = [(int(s), float(v)) for s, v in meta["loss_curve"] if s < resume_step]
        self.val_curve = [(int(s), float(v)) for s, v in meta.get("val_curve", [])
                          if s < resume_step]
        self.prior_train_time = float(meta["train_wall_time_s"])
        self.resumed = meta

    def configure_optimizers(self):
        # Decay matrices only: norms, biases, gains and SSM scalars (A_log, D, dt_bias) are not
        # weights whose size should shrink. The state-transition parameters the models tag
        # (models.backbone.mark_recurrent) get their own learning rate (paper 002 A.5).
        optimizer = torch.optim.AdamW(parameter_groups(self.model, self.config),
                                      lr=self.config.lr, betas=(0.9, self.config.adam_beta2),
                                      **adamw_implementation(self.config))
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: cosine_with_warmup(
            step, self.config.warmup_steps, self.config.max_steps, self.config.min_lr_ratio))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def adamw_implementation(config: TrainerConfig) -> dict:
    """AdamW's implementation keywords of trainer.fused_adamw: `fused` only when asked, since
    the flag is part of AdamW's groups (what the identity probe sees of the optimizer)."""
    return {"fused": True} if config.fused_adamw else {}


def parameter_groups(model: torch.nn.Module, config) -> list[dict]:
    """AdamW's groups: matrices with weight decay, everything else without, and the recurrent
    parameters (models.backbone.is_recurrent) at lr · recurrent_lr_ratio, never decayed. The
    first group is the matrices', whose lr the progress bar shows."""
    params = [p for p in model.parameters() if p.requires_grad]
    recurrent = [p for p in params if is_recurrent(p)]
    rest = [p for p in params if not is_recurrent(p)]
    return [{"params": [p for p in rest if p.dim() >= 2], "weight_decay": config.weight_decay},
            {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0},
            {"params": recurrent, "weight_decay": 0.0,
             "lr": config.lr * config.recurrent_lr_ratio}]


def scoring_inputs(task: Task, outputs: dict[str, Tensor]) -> tuple[Tensor | None,
                                                                     dict[str, Tensor] | None]:
    """ICLModule.held_out_outputs of a whole held-out set (in its order) as score_predictions
    takes them, on the CPU: the predictions (gap tasks), or the per-position scores."""
    if task.scoring == "gap":
        return outputs["prediction"].double().cpu(), None
    return None, {"loss": outputs["loss"].double().cpu(), "correct": outputs["correct"].bool().cpu()}
