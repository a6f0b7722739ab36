"""Entry locks: what keeps two workers (processes of `suite launcher=local workers=N`, tasks of a
SLURM job array, sequential runners, or any of them started on one out_dir) from running the same
run at once.

A lock is a file `<out_dir>/.locks/<key>.lock`, made with O_CREAT | O_EXCL (atomic on a local
file system and on NFSv3+), holding its owner's host, pid and start time. Its owner refreshes the
file's mtime while the run goes on (a heartbeat thread), and removes it when the run ends,
whichever way. A lock is stale when its owner is gone: on this host, a pid that no longer runs;
anywhere, no heartbeat for STALE_S; a SLURM array task's own lock from before it was requeued.
A stale lock is taken over by renaming it away first (only
one of several takers' renames succeeds) and then creating a new one."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import threading
import time
from pathlib import Path

LOCKS = ".locks"
HEARTBEAT_S = 20.0
STALE_S = 120.0  # six missed heartbeats: a worker on another node is gone


def lock_key(described: dict, out_dir: str) -> str:
    """What a lock is the lock of: a run's composed config (task, model, trainer, seed, resume)
    and where its record goes, not how the command line spelt it nor who launched it."""
    run = {k: v for k, v in described.items() if k not in ("overrides", "origin", "name")}
    return hashlib.sha1(json.dumps([run, os.path.abspath(out_dir)], sort_keys=True,
                                   default=str).encode()).hexdigest()[:20]


def run_lock_key(config) -> str:
    """lock_key of a composed run config (bench.config.RunConfig)."""
    return lock_key(config.describe(), config.out_dir)


def lock_path(out_dir: str, key: str) -> Path:
    return Path(out_dir) / LOCKS / f"{key}.lock"


def _job() -> str | None:
    """The SLURM array task this process is (the same in its requeued incarnation), if any."""
    job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{job}_{task}" if job and task else os.environ.get("SLURM_JOB_ID")


def _owner() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "job": _job(),
            "since": time.time()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        return True
    return True


def stale(path: Path, now: float | None = None) -> bool:
    """Whether the lock at path has no living owner (its pid gone on this host, or no heartbeat
    for STALE_S); a lock that cannot be read is stale once its file is STALE_S old."""
    try:
        age = (now or time.time()) - path.stat().st_mtime
    except FileNotFoundError:
        return False  # released meanwhile: nothing to take over
    try:
        owner = json.loads(path.read_text())
    except (OSError, ValueError):
        return age > STALE_S
    if not isinstance(owner, dict):
        return age > STALE_S
    if owner.get("host") == socket.gethostname() and isinstance(owner.get("pid"), int) \
            and not _alive(owner["pid"]):
        return True
    if owner.get("job") and owner.get("job") == _job() and owner.get("pid") != os.getpid():
        return True  # this array task's own lock from before it was requeued
    return age > STALE_S


class EntryLock:
    """A held lock: `release()` (or leaving a with-block) removes it; meanwhile a daemon thread
    refreshes its mtime every HEARTBEAT_S."""

    def __init__(self, path: Path):
        self.path = path
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        self._stop.set()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def __enter__(self) -> "EntryLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def try_lock(out_dir: str, key: str) -> EntryLock | None:
    """The lock of `key` in out_dir if nobody living holds it, else None."""
    path = lock_path(out_dir, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):  # once more after taking over a stale lock
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if not stale(path):
                return None
            aside = path.with_name(f"{path.name}.stale-{os.getpid()}")
            try:
                os.rename(path, aside)  # one taker wins; the others find no file
            except FileNotFoundError:
                continue
            with contextlib.suppress(OSError):
                os.unlink(aside)
            continue
        with os.fdopen(fd, "w") as handle:
            json.dump(_owner(), handle)
        return EntryLock(path)
    return None


def remove_locks_of(out_dirs, pid: int) -> int:
    """Remove the locks of this host that process `pid` held (a worker the launcher saw die, or
    killed): their entries are free again at once rather than after STALE_S. Returns how many."""
    host, removed = socket.gethostname(), 0
    for out_dir in set(out_dirs):
        for path in (Path(out_dir) / LOCKS).glob("*.lock"):
            with contextlib.suppress(OSError, ValueError):
                owner = json.loads(path.read_text())
                if owner.get("host") == host and owner.get("pid") == pid:
                    path.unlink()
                    removed += 1
    return removed
