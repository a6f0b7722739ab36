"""Processes that start with Lightning and the bench already imported: forked from a server that
imported them once (multiprocessing's forkserver, one per test worker), where a fresh
`python -m bench` imports them again, about 10 s of CPU on the 2-core test machine.

For tests of what processes do together (DDP ranks, a launcher and its workers, the signals
that stop them), not of what a fresh interpreter does: a forked process finds every module
imported, reads the environment only where the code reads it at run time, and leaves through
os._exit after its own cleanup (multiprocessing's), so no atexit hook runs. Tests of imports,
start-up and the shell's exit status start `python -m bench` themselves."""
from __future__ import annotations

import functools
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path

# What the server imports before it forks: everything a run or a suite needs.
PRELOAD = ["bench.cli.main", "bench.training.train", "warm_processes"]

@functools.cache
def _warm_context():
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def _run(argv: list[str], script: str | None, cwd: str, env: dict[str, str], out: str,
         err: str | None) -> None:
    """In the forked process: what `python -m bench argv` (or `python script argv`) does, in
    cwd, with env, its standard output and error written to the files out and err (None: both
    to out)."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.stdout.flush(), sys.stderr.flush()
    for fd, path in ((1, out), (2, err)):
        if path is None:  # stderr into stdout's open file (one offset, as stderr=STDOUT)
            os.dup2(1, 2)
            continue
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(handle, fd)
        os.close(handle)
    # the server (this process's parent) forks with one thread: a forked copy of a lock that
    # another thread held could hang this process (Linux shows the threads; elsewhere unchecked)
    tasks = Path(f"/proc/{os.getppid()}/task")
    if tasks.is_dir():
        server_threads = len(os.listdir(tasks))
        assert server_threads == 1, f"the warm server has {server_threads} threads: unsafe to fork"
    sys.argv = [script or "-m", *argv]
    if script:
        runpy.run_path(script, run_name="__main__")
    else:
        runpy.run_module("bench", run_name="__main__", alter_sys=True)


class WarmProcess:
    """A Popen-like handle (pid, poll, send_signal, kill, communicate, returncode) of a warm
    process: `python -m bench args` (or `python script args`) with stdout and stderr captured
    as text; merge_stderr: stderr into stdout, as Popen's stderr=STDOUT (communicate gives
    (output, None))."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str],
                 script: Path | None = None, merge_stderr: bool = False):
        self._captured = tempfile.TemporaryDirectory(prefix="warm-process-")
        self._out = Path(self._captured.name) / "out"
        self._err = None if merge_stderr else Path(self._captured.name) / "err"
        self._process = _warm_context().Process(
            target=_run, args=(list(args), str(script) if script else None, str(cwd), dict(env),
                               str(self._out), self._err and str(self._err)))
        self._process.start()
        self.pid = self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode  # as Popen's: -N when a signal N ended it

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, signal_number: int) -> None:
        os.kill(self.pid, signal_number)

    def kill(self) -> None:
        self._process.kill()

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(f"warm process {self.pid}", timeout)
        # a child that failed before it took its output over (its traceback went to the
        # server's stderr) wrote neither file
        return tuple(None if path is None else path.read_text() if path.exists() else ""
                     for path in (self._out, self._err))
