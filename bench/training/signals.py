"""How a run stops: the exceptions that end one early (Diverged, Interrupted), the guard that
turns SIGINT, SIGTERM and SIGHUP into them at safe points (SignalGuard), and, under DDP, the
ranks agreeing on a signal (agreed_signal) and leaving a run together once rank 0 has written its
record (lifecycle_group, leave_run_together, end_distributed, wait_for_rank_zero)."""
from __future__ import annotations

import contextlib
import datetime
import os
import signal
import sys
import threading
import time

import lightning as L
import torch

from bench.records.store import RunFailed, SignalAfterRecord

# How long the other ranks wait for rank 0 to finish a run (references, scoring, the record):
# first-time text baselines can take long.
RECORD_WAIT = datetime.timedelta(hours=6)


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

    def __init__(self, also: tuple = ()):
        self.signals = self.SIGNALS + tuple(s for s in also if s not in self.SIGNALS)
        self.signum: int | None = None
        self.mode = "raise"
        self.distributed = False
        self._previous: dict[int, object] = {}
        self.completed = ""  # the path of the run's ok record, once written

    def __enter__(self) -> "SignalGuard":
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
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
