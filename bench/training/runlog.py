"""The training log of a run: where it goes (run_log_dir), the Lightning logger that writes it
(make_logger: csv, tensorboard, wandb), and the callback that fills it (RunLog): the loss curve,
the learning rate and throughput, the run's hyperparameters and the scored headlines."""
from __future__ import annotations

import math
import os
import time

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger

from bench.config import RunConfig
from bench.training.csvlog import RunCSVLogger
from bench.training.signals import Diverged

LOG_ROOT = "logs"  # training logs: out_dir/logs/<run_id>/


def run_log_dir(run_id: str, resumed: dict | None = None) -> str:
    """Where a run's training log goes, relative to out_dir: logs/<run_id>; for a resumed run,
    the log of the run it continues (its checkpoint says which), so the log goes on there."""
    if resumed:
        carried = os.path.normpath(str(resumed.get("log_dir") or ""))
        if resumed.get("log_dir") and not os.path.isabs(carried) and not carried.startswith(".."):
            return carried
        run_id = str(resumed.get("run_id") or run_id)
    return os.path.join(LOG_ROOT, run_id)


def make_logger(config: RunConfig, log_dir: str, resume_step: int = 0):
    """The Lightning logger of `trainer.logger`, writing into out_dir/<log_dir>; None for none.
    `resume_step`: the step a resumed run goes on from; the log's entries from it on are the
    ones it writes again."""
    kind = config.trainer.logger
    path = os.path.normpath(os.path.join(config.out_dir, log_dir))
    if kind == "csv":
        return RunCSVLogger(path)
    if kind == "tensorboard":
        # purge_step (SummaryWriter's): TensorBoard hides the earlier events from that step on
        return TensorBoardLogger(save_dir=os.path.dirname(path), name=os.path.basename(path),
                                 version="", default_hp_metric=False,
                                 purge_step=resume_step or None)
    if kind == "wandb":
        os.environ.setdefault("WANDB_MODE", "offline")  # a user's WANDB_MODE=online wins
        # id: the log's run id, so a resumed run continues the same wandb run
        # group: the sweep or suite the run belongs to, so W&B shows its runs together
        kind = str(config.origin or "adhoc").split(":", 1)[0]
        return WandbLogger(name=os.path.basename(path), id=os.path.basename(path),
                           save_dir=path, project="icl-bench", group=config.origin or None,
                           tags=[config.task_name, config.model_name, kind])
    return None


class RunLog(L.Callback):
    """The training log: every `log_every` steps one row at that step, written at once (so a
    run that fails leaves the steps it did): `loss` (the step's training loss, as in the
    record's loss curve: the mean over ranks), `lr` (the learning rate the step used), `steps_per_s` and
    `tokens_per_s` (batch size x seq_len of all ranks per step) over the steps since the
    previous row, or since this process began training. A diverged step gets its row too (loss
    nan, no throughput). Rank 0 only. A resumed run continues the log from the checkpoint's
    step (see bench.training.csvlog). The run's composed configuration goes to the logger's
    hyperparameters when training starts (hparams.yaml), LiveValidation's rows and the final
    evaluation's headline (log_final) to its metrics."""

    def __init__(self, logger, log_every: int, directory: str, hyperparameters: dict):
        self.logger, self.log_every, self.directory = logger, log_every, directory
        self.hyperparameters = hyperparameters
        self._since: tuple[int, float] | None = None  # (step, time) the interval began
        self._step, self._lr, self._tokens = 0, math.nan, 0

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        step = int(trainer.global_step)  # > 0 when resumed from a checkpoint
        if isinstance(self.logger, RunCSVLogger):  # TensorBoard's: make_logger's purge_step
            self.logger.keep_before = step
        if trainer.is_global_zero:
            os.makedirs(self.directory, exist_ok=True)
            self.logger.log_hyperparams(self.hyperparameters)
            self.logger.save()

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch,
                             batch_idx: int) -> None:
        self._step = int(trainer.global_step)
        self._lr = float(trainer.optimizers[0].param_groups[0]["lr"])
        # positions trained on by all ranks together (each rank samples its own batch) in all
        # micro-batches of the step
        self._tokens = (batch.inputs.shape[0] * batch.inputs.shape[1] * trainer.world_size
                        * trainer.accumulate_grad_batches)
        if self._since is None:
            self._since = (self._step, time.perf_counter())

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        step = self._step
        if step % self.log_every or not trainer.is_global_zero or module.micro_index:
            return  # (a micro-batch before the step's last)
        now = time.perf_counter()
        since_step, since_time = self._since
        steps, seconds = step + 1 - since_step, max(now - since_time, 1e-9)
        self._since = (step + 1, now)
        self.write({"loss": module.logged_loss, "lr": self._lr, "steps_per_s": steps / seconds,
                     "tokens_per_s": steps * self._tokens / seconds}, step)

    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            self.logger.finalize("success")

    def on_exception(self, trainer: L.Trainer, module: L.LightningModule,
                     exception: BaseException) -> None:
        if not trainer.is_global_zero:
            return
        try:
            if isinstance(exception, Diverged) and exception.loss is not None:
                self.write({"loss": exception.loss, "lr": self._lr}, exception.step)
            self.logger.finalize("failed")
        except Exception:  # the run's own error is the one its record must report
            pass

    def write(self, metrics: dict, step: int) -> None:
        """One row of the log at `step`, written at once (rank 0)."""
        os.makedirs(self.directory, exist_ok=True)
        self.logger.log_metrics(metrics, step=step)
        self.logger.save()

    def log_final(self, metrics: dict, step: int) -> None:
        """The final evaluation's headline (`test/...`) at the last step, then the log closed
        again (on_train_end closed it; a TensorBoard writer reopens for the row)."""
        final = headline(metrics, "test")
        self.write(final, step)
        if type(self.logger).__name__ == "TensorBoardLogger":
            # its HParams dashboard needs the config and the metrics it tabulates declared
            # together (hparams.yaml alone leaves it empty); the metrics' values are the
            # test/* scalars just written (log_hyperparams would log them again at step 0)
            from torch.utils.tensorboard.summary import hparams as hparams_summaries
            plain = {key: value if isinstance(value, (bool, int, float, str)) else str(value)
                     for key, value in self.hyperparameters.items()}
            writer = self.logger.experiment.file_writer  # open: the row above went through it
            for summary in hparams_summaries(plain, final):
                writer.add_summary(summary)
            writer.flush()
        self.logger.finalize("success")


def hyperparameters(described: dict, run_id: str) -> dict:
    """A run's composed configuration as one flat mapping for a logger's hyperparameters:
    task.<field>, model.<field> and trainer.<field> with each group's name (and the task's and
    model's family), the seed and the run id."""
    flat = {"run_id": run_id, "seed": described["seed"]}
    for group in ("task", "model", "trainer"):
        entry = described[group]
        flat.update({f"{group}.{key}": entry[key] for key in ("name", "family") if key in entry})
        flat.update({f"{group}.{key}": value for key, value in entry["config"].items()})
    return flat


def headline(metrics: dict, prefix: str) -> dict[str, float]:
    """What the training log gets of a scored held-out set, as `<prefix>/<name>`, the headline
    first: the model's Bayes gap (to the gap reference), its 95% interval, the relative gap and
    the model's loss; for text (no Bayes predictor) nats/token, its interval and perplexity."""
    if metrics.get("scoring") == "perplexity":
        low, high = metrics["loss_ci"]["model"]
        values = {"loss": metrics["loss"]["model"], "loss_ci_low": low, "loss_ci_high": high,
                  "perplexity": metrics["perplexity"]["model"]}
    else:
        low, high = metrics["bayes_gap_ci"]
        values = {"bayes_gap": metrics["bayes_gap"], "bayes_gap_ci_low": low,
                  "bayes_gap_ci_high": high, "relative_gap": metrics["relative_gap"],
                  "loss": metrics["loss"]["model"]}
    return {f"{prefix}/{name}": float(value) for name, value in values.items()}
