"""Lightning glue: the training step for any (model, task) pair, and one whole run.

A run that has started ends in exactly one of two ways: an `ok` record, or a `failed` record
(written by rank 0) and `RunFailed`. A non-finite training loss stops it at that step; SIGINT
and SIGTERM stop it at the next training batch (a second signal at once); any other exception
stops it where it happened. Nothing is written before a resume checkpoint has been validated."""
from __future__ import annotations

import contextlib
import datetime
import math
import os
import signal
import sys
import threading
import time
import warnings

import lightning as L
import torchmetrics
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import Tensor

from bench.config import ConfigError, RunConfig, TrainerConfig, first_line
from bench import reference_cache
from bench.csvlog import RunCSVLogger
from bench.evaluate import (ReferenceScores, masked_loss, probe_summary, reference_scores,
                            score_predictions, token_scores)
from bench.checks import check_resume, loader_workers, planned_environment, world_size
from bench.records import (CHECKPOINT_FORMAT, CHECKPOINT_KEY, SCHEMA, RunFailed, SignalAfterRecord,
                           code_of_this_process, new_run_id, write_record)
from models import build_model
from models.backbone import Backbone, IOSpec
from models.ssd import kernel_fallback
from tasks import task_families
from tasks.base import VAL_STREAM, Batch, Task

# Under 16-mixed, checks in a row with a non-finite loss before a run counts as diverged: an
# overflow is skipped by GradScaler (and the scale lowered); only a persistent NaN is fatal.
NONFINITE_PATIENCE = 3
# How long the other ranks wait for rank 0 to finish a run (references, scoring, the record):
# first-time text baselines can take long.
RECORD_WAIT = datetime.timedelta(hours=6)



def cosine_with_warmup(step: int, warmup: int, total: int, floor: float) -> float:
    """Learning-rate multiplier: linear warm-up, then cosine from 1 down to `floor`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


class Diverged(FloatingPointError):
    """The training loss is not finite: every further step would only train on NaN."""

    def __init__(self, step: int, loss: float | None):
        self.step, self.loss = step, loss
        where = f"loss {loss}" if loss is not None else "on another rank"
        super().__init__(f"diverged at step {step}: {where}")


class Interrupted(Exception):
    """SIGINT, SIGTERM or SIGHUP asked the run to stop (an Exception, unlike KeyboardInterrupt and
    Lightning's SIGTERMException, so that Lightning tears down normally and re-raises it)."""

    def __init__(self, signum: int | None):
        self.signum = signum
        super().__init__(f"interrupted ({signal_name(signum)})")


class ReferenceNotFinite(ArithmeticError):
    """The gap reference's loss on the held-out set is not a number: so is every gap."""


def check_references(metrics: dict) -> None:
    """References whose held-out loss is not finite (a task configured beyond what they can
    compute: linreg inputs scaled by 1e30 gave gd5 NaN in an `ok` record, unflagged) are named
    in metrics.nonfinite_references and a warning; when the gap reference is one of them the run
    fails, as its gap would be undefined."""
    losses = metrics.get("loss") or {}
    broken = [name for name in metrics.get("roles") or {}
              if not isinstance(losses.get(name), (int, float)) or not math.isfinite(losses[name])]
    if not broken:
        return
    reference = metrics.get("gap_reference")
    if reference in broken:
        raise ReferenceNotFinite(f"the loss of the gap reference {reference} on the held-out set "
                                 "is not finite; the task's settings are beyond what it computes")
    metrics["nonfinite_references"] = broken
    print(f"warning: the held-out loss of {', '.join(broken)} is not finite (the task's settings "
          "are beyond what they compute); named in metrics.nonfinite_references", file=sys.stderr)


def signal_name(signum: int | None) -> str:
    return signal.Signals(signum).name if signum is not None else "on another rank"


class SignalGuard:
    """SIGINT, SIGTERM and SIGHUP handlers for the duration of a run; the previous ones come back on exit.

    What a signal does depends on the phase (`mode`):
    - "flag" (training): only note it; the training step raises Interrupted at the next batch,
      so that no checkpoint or optimizer step is cut in half;
    - "raise" (building, evaluating: nothing is being written): raise Interrupted at once;
    - "defer" (writing the record, or waiting for rank 0 to write it): only note it, so the
      record is never half-written.
    In one process a second signal while training raises at once, in case a step takes very
    long. Under DDP (`distributed`) it does not: a rank that raised alone would leave the others
    waiting in a collective, and a signal sent to every process of a job (scancel, kill -- -PGID)
    reaches each rank once, so the ranks stop together at the next check step (ICLModule).
    Lightning installs a SIGTERM handler of its own when fit or test starts, which forwards the
    signal to the other local ranks and broadcasts from inside the handler; `reinstall` puts
    ours back (KeepSignalHandlers). Signal handlers can only be set in the main thread;
    elsewhere the guard does nothing, and an ignored signal stays ignored."""

    # SIGHUP: the terminal closed or the SSH connection dropped; it ends a run like SIGTERM
    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self):
        self.signum: int | None = None
        self.mode = "raise"
        self.distributed = False
        self._previous: dict[int, object] = {}
        self.completed = ""  # the path of the run's ok record, once written

    def __enter__(self) -> "SignalGuard":
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                # An ignored signal stays ignored (e.g. SIGINT of a shell's background job).
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        installed, self._previous = bool(self._previous), {}
        if installed and exc_type is None and self.signum is not None:
            # Noted while the record was written and the run ended well: stop (a suite too),
            # saying that the record is complete, instead of swallowing the signal.
            if self.completed:
                raise SignalAfterRecord(self.signum, self.completed)
            signal.raise_signal(self.signum)  # a rank without the record: its previous handler

    def __getstate__(self) -> dict:
        # Pickled with the module (ddp_spawn): handlers belong to the process that set them.
        return {"signum": None, "mode": "flag", "_previous": {}}

    def reinstall(self) -> None:
        """Our handlers again, for the signals we handle, if something replaced them."""
        for signum in self._previous:
            if signal.getsignal(signum) != self._handle:
                signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame) -> None:
        repeated = self.signum is not None
        if not repeated:
            self.signum = signum
        if self.mode == "raise" or (self.mode == "flag" and repeated and not self.distributed):
            raise Interrupted(self.signum)

    @contextlib.contextmanager
    def phase(self, mode: str):
        previous, self.mode = self.mode, mode
        try:
            self.check()  # a signal that came in the previous phase
            yield
        finally:
            self.mode = previous

    def check(self) -> None:
        """Raise for a signal noted earlier; under DDP the ranks agree on signals elsewhere
        (ICLModule), so a rank never stops alone here."""
        if self.signum is not None and self.mode != "defer" and not self.distributed:
            raise Interrupted(self.signum)


class KeepSignalHandlers(L.Callback):
    """Puts the run's SignalGuard handlers back when training and evaluation start: Lightning
    installs its own SIGTERM handler just before (see SignalGuard)."""

    def __init__(self, signals: SignalGuard):
        self.signals = signals

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.signals.reinstall()

    def on_test_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.signals.reinstall()


_lifecycle: dict = {}  # the process's gloo group for leaving runs together, and rank 0's pid


def lifecycle_group():
    """A gloo (CPU) process group with a long timeout (RECORD_WAIT), made once per process by
    every rank: the other ranks wait in it while rank 0 alone scores a run and writes its
    record, which can outlast the training backend's collective timeout."""
    if "group" not in _lifecycle:
        _lifecycle["group"] = torch.distributed.new_group(backend="gloo", timeout=RECORD_WAIT)
    return _lifecycle["group"]


def agreed_signal(signum: int | None, world: int, device: torch.device) -> int | None:
    """The signal every rank reports when some rank was signalled (the largest number, so
    SIGTERM wins over SIGINT): called by all ranks together, on the training device."""
    if world == 1:
        return signum
    number = torch.tensor([signum or 0], dtype=torch.int64, device=device)
    torch.distributed.all_reduce(number, op=torch.distributed.ReduceOp.MAX)
    return int(number) or None


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

    def train_time(self) -> float:
        return self.prior_train_time + time.perf_counter() - self.clock_start

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        loss = masked_loss(self.task, self.model(batch.inputs), batch)
        step = int(self.global_step)
        if step % self.config.log_every == 0 or step == self.config.max_steps - 1:
            self._check_step(loss, step)
        elif self.trainer.world_size == 1 and self.signals is not None \
                and self.signals.signum is not None:
            raise Interrupted(self.signals.signum)  # alone, a signal needs no agreement
        return loss

    def on_train_start(self) -> None:
        self.train_device = str(self.device)  # Lightning moves the model back to the CPU later

    def on_fit_start(self) -> None:
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
            self.log("loss", mean, prog_bar=True, logger=False)  # the run log is RunLog's
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
                                      lr=self.config.lr, betas=(0.9, self.config.adam_beta2))
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: cosine_with_warmup(
            step, self.config.warmup_steps, self.config.max_steps, self.config.min_lr_ratio))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def parameter_groups(model: torch.nn.Module, config) -> list[dict]:
    """AdamW's groups: matrices with weight decay, everything else without, and the recurrent
    parameters (models.backbone.is_recurrent) at lr · recurrent_lr_ratio, never decayed. The
    first group is the matrices', whose lr the progress bar shows."""
    from models.backbone import is_recurrent
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


def build(config: RunConfig) -> tuple[Task, Backbone]:
    if config.trainer.threads > 0:
        torch.set_num_threads(config.trainer.threads)
    # trainer.batch_size is the global batch: each of the world_size ranks samples its share
    # (validated to divide evenly when the config was composed)
    task = task_families()[config.task_family](
        config.task, batch_size=config.trainer.batch_size // world_size(config), seed=config.seed)
    task.progress = config.trainer.progress  # for tasks with long preparation (text: tokenizing)
    task.loader_workers = loader_workers(config)
    io = IOSpec(task.kind, task.input_dim, task.output_dim, task.seq_len)
    torch.manual_seed(config.seed)  # parameter initialisation
    model = build_model(config.model_family, config.model, io)
    if config.trainer.compile:
        # in place: parameter names (checkpoints) stay those of the eager model
        model.compile()
    return task, model


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
        from lightning.pytorch.loggers import TensorBoardLogger
        # purge_step (SummaryWriter's): TensorBoard hides the earlier events from that step on
        return TensorBoardLogger(save_dir=os.path.dirname(path), name=os.path.basename(path),
                                 version="", default_hp_metric=False,
                                 purge_step=resume_step or None)
    if kind == "wandb":
        os.environ.setdefault("WANDB_MODE", "offline")  # a user's WANDB_MODE=online wins
        from lightning.pytorch.loggers import WandbLogger
        # id: the log's run id, so a resumed run continues the same wandb run
        return WandbLogger(name=os.path.basename(path), id=os.path.basename(path),
                           save_dir=path, project="icl-bench")
    return None


class RunLog(L.Callback):
    """The training log: every `log_every` steps one row at that step, written at once (so a
    run that fails leaves the steps it did): `loss` (the step's training loss, as in the
    record's loss curve: the mean over ranks), `lr` (the learning rate the step used), `steps_per_s` and
    `tokens_per_s` (batch size x seq_len of all ranks per step) over the steps since the
    previous row, or since this process began training. A diverged step gets its row too (loss
    nan, no throughput). Rank 0 only. A resumed run continues the log from the checkpoint's
    step (see bench.csvlog). The run's composed configuration goes to the logger's
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
        # positions trained on by all ranks together (each rank samples its own batch)
        self._tokens = batch.inputs.shape[0] * batch.inputs.shape[1] * trainer.world_size
        if self._since is None:
            self._since = (self._step, time.perf_counter())

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        step = self._step
        if step % self.log_every or not trainer.is_global_zero:
            return
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
        self.write(headline(metrics, "test"), step)
        self.logger.finalize("success")


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
        if step > 0 and step % self.config.val_every == 0:
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
            with torch.no_grad(), torch.random.fork_rng(devices=self._rng_devices(module)), \
                    trainer.precision_plugin.forward_context():
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


class StderrProgressBar(L.pytorch.callbacks.TQDMProgressBar):
    """Lightning's bars on stderr, not stdout: `run ... > log.txt` keeps only the results. Each
    bar is Lightning's own, made while sys.stdout names stderr (Lightning passes file=sys.stdout
    when it makes one)."""

    def init_sanity_tqdm(self):
        with contextlib.redirect_stdout(sys.stderr):
            return super().init_sanity_tqdm()

    def init_train_tqdm(self):
        with contextlib.redirect_stdout(sys.stderr):
            return super().init_train_tqdm()

    def init_validation_tqdm(self):
        with contextlib.redirect_stdout(sys.stderr):
            return super().init_validation_tqdm()

    def init_test_tqdm(self):
        with contextlib.redirect_stdout(sys.stderr):
            return super().init_test_tqdm()

    def init_predict_tqdm(self):
        with contextlib.redirect_stdout(sys.stderr):
            return super().init_predict_tqdm()


def make_trainer(config: RunConfig, run_id: str, log_dir: str | None = None,
                 signals: SignalGuard | None = None, resume_step: int = 0) -> L.Trainer:
    """The Trainer of a run; its training log goes to out_dir/<log_dir> (default
    logs/<run_id>) unless trainer.logger=none, continued from `resume_step` when resumed;
    `signals`' handlers are kept over Lightning's."""
    t = config.trainer
    # A terminal redraws the bar in place; a log file gets a line per refresh, so refresh less.
    callbacks: list = [StderrProgressBar(
        refresh_rate=1 if sys.stderr.isatty() else max(1, t.max_steps // 20))] if t.progress else []
    if t.checkpoint_every > 0:
        callbacks.append(L.pytorch.callbacks.ModelCheckpoint(
            dirpath=os.path.join(config.out_dir, "checkpoints", run_id), save_last=True,
            every_n_train_steps=t.checkpoint_every, save_top_k=-1))
    if signals is not None:
        callbacks.append(KeepSignalHandlers(signals))
    log_dir = log_dir or run_log_dir(run_id)
    logger = make_logger(config, log_dir, resume_step)
    run_log = None
    if logger is not None:
        run_log = RunLog(logger, t.log_every, os.path.join(config.out_dir, log_dir),
                         hyperparameters(config.describe(), run_id))
        callbacks.append(run_log)
    if t.val_every > 0:  # before RunLog, whose on_train_end closes the log
        callbacks.insert(len(callbacks) - (run_log is not None), LiveValidation(t, run_log))
    return L.Trainer(max_steps=t.max_steps, accelerator=t.accelerator, devices=t.devices,
                     num_nodes=t.num_nodes, strategy=t.strategy, precision=t.precision,
                     gradient_clip_val=t.grad_clip or None, logger=False,
                     enable_checkpointing=t.checkpoint_every > 0, callbacks=callbacks,
                     enable_progress_bar=t.progress, enable_model_summary=False,
                     num_sanity_val_steps=0, limit_val_batches=0, log_every_n_steps=t.log_every,
                     use_distributed_sampler=False, deterministic=False)


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


def quiet_lightning() -> None:
    """Silence advice that does not apply here: the data loader yields step numbers only."""
    for pattern in (".*does not have many workers.*", ".*GPU available but not used.*",
                    ".*`isinstance\\(treespec, LeafSpec\\)`.*", ".*LeafSpec.*",
                    ".*Total length of `DataLoader`.*", ".*IterableDataset.*",
                    # a resumed run needs the weights, optimizer and loop state, not the state
                    # of the ModelCheckpoint callback that wrote the file
                    ".*callbacks used to create the checkpoint need to be provided.*"):
        warnings.filterwarnings("ignore", message=pattern)
    import logging
    for name in ("lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _global_zero(trainer: L.Trainer | None) -> bool:
    if trainer is not None:
        return trainer.is_global_zero
    # Before the Trainer exists: Lightning's launcher has put the rank in the environment.
    from lightning.pytorch.utilities.rank_zero import rank_zero_only
    return getattr(rank_zero_only, "rank", 0) == 0


def _failure(error: BaseException, signals: SignalGuard, step: int) -> tuple[str, int]:
    """The record's reason and the process's exit status for an exception that ended a run."""
    if isinstance(error, Diverged):
        return str(error), 1
    signum = error.signum if isinstance(error, Interrupted) else signals.signum
    if signum is None and isinstance(error, KeyboardInterrupt):
        signum = signal.SIGINT  # no handler of ours (run() was called outside the main thread)
    if signum is None and isinstance(error, SIGTERMException):
        signum = signal.SIGTERM
    if signum is not None or isinstance(error, Interrupted):
        return (f"interrupted ({signal_name(signum)}) at step {step}",
                128 + signum if signum is not None else 1)
    return f"{type(error).__name__}: {first_line(error)}".rstrip(": "), 1


def run(config: RunConfig, weights: dict | None = None,
        weights_path: str = "") -> tuple[dict, str]:
    """Train, evaluate on the held-out set, write the record. Returns (record, path); path is
    "" on ranks other than 0. A run that fails after it started writes a `failed` record (rank
    0) and raises RunFailed; a bad resume checkpoint raises ConfigError before anything runs.

    With `weights` (bench.weights.load_weights of `weights_path`) the model starts from them and
    is not trained: `python -m bench eval`. The record's `train` is the weights' run's, and it
    names the file (`evaluated_weights`, `weights_run_id`); weights that do not fit the model
    raise ConfigError before anything runs. A trained run saves its weights (trainer.save_weights)
    to out_dir/weights/<run_id>.pt just before its ok record, which names the file (`weights`)."""
    quiet_lightning()
    t = config.trainer
    if weights is not None:
        from bench.weights import check_weights_fit
        check_weights_fit(config, weights)
    elif t.warmup_steps > t.max_steps:  # legal (a study of warm-up), but rarely what is meant
        print(f"warning: trainer.warmup_steps={t.warmup_steps} > trainer.max_steps="
              f"{t.max_steps}: the learning rate stays in its warm-up and never reaches "
              f"trainer.lr={t.lr}", file=sys.stderr)
    resumed = check_resume(config) if config.resume else None
    run_id = new_run_id(config.task_name, config.model_name, config.seed)
    described = config.describe()
    record: dict = {"schema": SCHEMA, "run_id": run_id, **described,
                    "provenance": code_of_this_process(), "status": "running"}
    if resumed is not None:
        record["resumed_from"] = os.path.abspath(config.resume)
        record["resumed_run_id"] = resumed.get("run_id")
    if weights is not None:
        record["evaluated_weights"] = os.path.abspath(weights_path) if weights_path else None
        record["weights_run_id"] = weights.get("run_id")
    record["weights"] = None  # the saved weights' path relative to out_dir, once written
    log_dir = run_log_dir(run_id, resumed)  # relative to out_dir
    record["log_dir"] = log_dir if config.trainer.logger != "none" else None
    run_info = {"run_id": run_id, **{k: described[k] for k in ("task", "model", "trainer", "seed")},
                "log_dir": log_dir, "environment": planned_environment(config)._asdict(),
                "code": record["provenance"]["code"]}
    start = time.perf_counter()
    trainer = module = model = None
    path, failure = "", None
    with SignalGuard() as signals:
        signals.distributed = world_size(config) > 1
        try:
            apply_tf32_policy(config.trainer.tf32)
            task, model = build(config)
            record["params"] = model.num_parameters()
            record["state_size"] = model.state_size(task.seq_len)
            if weights is not None:  # an evaluation: the model as trained by the weights' run
                model.load_state_dict(weights["state_dict"])
                record["train"] = weights.get("train")
            module = ICLModule(model, task, config.trainer, run_info, signals, start)
            trainer = make_trainer(config, run_id, log_dir, signals,
                                   resumed["resume_step"] if resumed else 0)
            if weights is None:
                with signals.phase("flag"):
                    trainer.fit(module, datamodule=task, ckpt_path=config.resume or None)
                record["train"] = _train_summary(trainer, module, model)
            clock = [time.perf_counter()]

            def lap() -> float:
                clock.append(time.perf_counter())
                return clock[-1] - clock[-2]

            held_out, references = reference_cache.held_out_set(config, task)
            times = {"held_out": lap()}
            # Under DDP the ranks agree on a signal at the end of evaluation (ICLModule);
            # alone, a signal stops it at once (a signal after the last step included).
            with signals.phase("flag" if signals.distributed else "raise"):
                trainer.test(module, datamodule=task, verbose=False)
            times["model"] = lap()
            if trainer.is_global_zero:  # the record belongs to rank 0
                cached = references is not None
                references = reference_cache.complete(config, task, held_out, references)
                times["references"] = lap()
                record.update(score_predictions(
                    task, held_out, getattr(module, "test_predictions", None),
                    config.trainer.bootstrap, references, getattr(module, "test_scores", None)))
                times["scoring"] = lap()
                check_references(record["metrics"])
                probe = probe_summary(task, model, held_out, config.trainer.eval_batch_size)
                if probe is not None:
                    record["metrics"]["probe"] = probe
                    times["probe"] = lap()
                run_log = next((c for c in trainer.callbacks if isinstance(c, RunLog)), None)
                if run_log is not None and weights is None:  # the trained run's log
                    run_log.log_final(record["metrics"], int(trainer.global_step))
                # predicted under the training precision (autocast for *-mixed), as trained
                record["eval"] = {"device": module.eval_device, "world_size": trainer.world_size,
                                  "precision": str(trainer.precision),
                                  "compile": config.trainer.compile,
                                  "kernel": scan_kernels(model, module.eval_device),
                                  "dtype": module.eval_dtype, "references_cached": cached,
                                  "time_s": times}
                record["eval_time_s"] = clock[-1] - clock[0]
                record["status"] = "ok"
                record["wall_time_s"] = module.prior_train_time + time.perf_counter() - start
                signals.mode = "defer"  # the record is written whole; a signal now waits for it
                if weights is None and config.trainer.save_weights:
                    from bench.weights import save_weights
                    record["weights"] = save_weights(config.out_dir, record, model)
                path = str(write_record(config.out_dir, record))
                signals.completed = path  # a signal noted meanwhile must not say otherwise
            signals.mode = "defer"  # the other ranks: waiting for rank 0, a signal is noted
        except BaseException as error:
            # Everything after the run started, SystemExit and KeyboardInterrupt included
            # (Lightning turns Ctrl-C into sys.exit(1), SIGTERM into a SystemExit subclass),
            # ends here: one failed record, then RunFailed.
            signals.mode = "defer"  # from here on a signal must not cut the record in half
            step = int(trainer.global_step) if trainer is not None else 0
            reason, exit_code = _failure(error, signals, step)
            record["status"], record["reason"] = "failed", reason
            # the per-position and per-sequence losses are for boards and comparisons of ok
            # runs: without them a failed record is smaller than the ok one it replaces (which
            # a full disk could not take)
            record.pop("per_position", None)
            record.pop("per_sequence", None)
            prior = module.prior_train_time if module is not None else 0.0
            record["wall_time_s"] = prior + time.perf_counter() - start
            if module is not None and "train" not in record and weights is None:
                record["train"] = _train_summary(trainer, module, model)
            if _global_zero(trainer):
                try:
                    path = str(write_record(config.out_dir, record))
                except Exception as write_error:
                    reason += (f"; its failed record could not be written: "
                               f"{type(write_error).__name__}: {first_line(write_error)}")
            failure = RunFailed(reason, path or None, exit_code)
            failure.__cause__ = error
        if trainer is not None and trainer.world_size > 1 and torch.distributed.is_initialized():
            failure = leave_run_together(trainer, signals, failure, path)
        if failure is not None:
            raise failure
        return record, path


def leave_run_together(trainer: L.Trainer, signals: SignalGuard, failure: RunFailed | None,
                       path: str) -> RunFailed | None:
    """Every rank waits here until rank 0 has finished the run (scored it, written its record),
    then all leave with rank 0's outcome: its failure (reason, exit status) becomes every rank's,
    so a suite goes on, or stops, on all ranks together, entry by entry. A signal that any rank
    noted meanwhile is re-raised on every rank once the run is over (SignalGuard's exit), as it
    would be in one process."""
    mine = {"failure": (failure.reason, failure.exit_code) if failure is not None else None,
            "signum": signals.signum, "pid": os.getpid()}
    everyone: list = [None] * trainer.world_size
    torch.distributed.all_gather_object(everyone, mine, group=lifecycle_group())
    _lifecycle["rank0_pid"] = everyone[0]["pid"]
    if signals.signum is None:
        signals.signum = max((e["signum"] for e in everyone if e["signum"] is not None),
                             default=None)
    if everyone[0]["failure"] is None:
        if failure is not None:  # a fault of this rank alone; rank 0's record says ok
            print(f"warning: rank {trainer.global_rank}: {failure.reason}", file=sys.stderr)
        return None
    if trainer.is_global_zero:
        return failure
    # rank 0's exit status; the reason this rank's own (its stop step), or rank 0's
    reason, exit_code = everyone[0]["failure"]
    own = failure.reason if failure is not None else f"{reason} (on rank 0)"
    error = RunFailed(f"{own} (rank {trainer.global_rank})", None, exit_code)
    error.__cause__ = failure.__cause__ if failure is not None else None
    return error


def end_distributed() -> None:
    """Destroys this process's process groups (the training backend's and the lifecycle group)
    once its runs are over, on every path out. Left to the interpreter's exit, gloo's worker
    threads can outlive it and abort the process (SIGABRT, "terminate called without an active
    exception") after its work is done: seen on rank 1 of a 2-rank suite. Local, no collective:
    every rank has left its last run together with the others (leave_run_together)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    _lifecycle.pop("group", None)


def wait_for_rank_zero(timeout: float = 30.0) -> None:
    """On a rank that Lightning's launcher started (its parent is rank 0's process), wait for
    rank 0 to exit first, up to `timeout` seconds: the launcher kills every process of a job as
    soon as it sees another rank exit non-zero, which would cut rank 0's own exit short."""
    parent = _lifecycle.get("rank0_pid")
    if parent is None or parent == os.getpid() or os.getppid() != parent:
        return
    deadline = time.monotonic() + timeout
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.05)


def apply_tf32_policy(enabled: bool) -> None:
    """Whether float32 matrix products and convolutions on CUDA may use TF32 tensor cores (10
    mantissa bits): torch's matmuls, cuDNN's convolutions and LSTMs, and Triton's float32 dot
    products (the mamba_ssm kernel; TRITON_F32_DEFAULT is read when a kernel is compiled, and is
    part of Triton's cache key, so a process keeps the policy of its first compiled kernel).
    Off by default (trainer.tf32=false): 32-true then means IEEE float32. Recorded as
    train.tf32."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    os.environ["TRITON_F32_DEFAULT"] = "tf32" if enabled else "ieee"


def scan_kernels(model: Backbone, device: str) -> str | None:
    """The SSD scan implementation(s) the model's Mamba mixers ran on `device` (torch, sequential,
    mamba_ssm), "+"-joined if they differ; None for models without one."""
    from models.mamba import Mamba2Mixer
    from models.ssd import resolve_kernel
    used = sorted({resolve_kernel(module.kernel, torch.device(device))
                   for module in model.modules() if isinstance(module, Mamba2Mixer)})
    return "+".join(used) or None


def device_name(device: str) -> str:
    """"cpu", or the CUDA device's name (e.g. "NVIDIA H100 80GB HBM3"): part of what a record
    says about where it ran, and of its identity when records are pooled."""
    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def _train_summary(trainer: L.Trainer | None, module: ICLModule, model: Backbone) -> dict:
    """The training part of the record, the resumed part of the run included."""
    return {"steps": int(trainer.global_step) if trainer is not None else 0,
            "wall_time_s": module.train_time(),
            "device": getattr(module, "train_device", str(next(model.parameters()).device)),
            "device_name": device_name(getattr(module, "train_device", "cpu")),
            "world_size": trainer.world_size if trainer is not None else None,
            "precision": str(trainer.precision) if trainer is not None else None,
            "tf32": module.config.tf32,
            "compile": module.config.compile,
            "kernel": scan_kernels(model, getattr(module, "train_device", "cpu")),
            "kernel_fallback": kernel_fallback(getattr(module, "train_device", "cpu")),
            "loss_curve": [list(point) for point in module.loss_curve],
            "val_curve": [list(point) for point in module.val_curve]}
