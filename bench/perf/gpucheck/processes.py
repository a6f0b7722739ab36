"""Process control: each section (and each run it starts) in a process group of its own, killed
whole at its cap (SIGTERM, then SIGKILL); SIGTERM or SIGINT to the driver stops it."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


GRACE_S = 5  # between SIGTERM and SIGKILL of a section's process group at its cap


def kill_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def start_group(argv: list[str], env: dict | None = None, cwd: Path = REPO):
    """argv started in a session (process group) of its own, its output to temporary files."""
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err,
                               start_new_session=True)
    process.files = (out, err)
    return process


def finish_group(process, timeout: float) -> dict:
    """Wait for a start_group process until `timeout` seconds; then SIGTERM to its whole group
    and SIGKILL GRACE_S later. Whatever is left of the group after it ended (an orphaned child)
    is killed too. Returns the exit status ("timeout" when killed), seconds and output."""
    start = time.perf_counter()
    try:
        code = process.wait(timeout=max(0.0, timeout))
    except subprocess.TimeoutExpired:
        code = "timeout"
        kill_group(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            kill_group(process.pid, signal.SIGKILL)
            process.wait()
    kill_group(process.pid, signal.SIGKILL)
    texts = []
    for handle in process.files:
        handle.seek(0)
        texts.append(handle.read().decode(errors="replace"))
        handle.close()
    return {"exit": code, "wait_s": time.perf_counter() - start, "stdout": texts[0],
            "stderr": texts[1]}


def run_group(argv: list[str], timeout: float, env: dict | None = None) -> dict:
    start = time.perf_counter()
    process = start_group(argv, env)
    try:
        done = finish_group(process, timeout)
    except BaseException:  # the caller stopped (a signal): the group goes with it
        kill_group(process.pid, signal.SIGKILL)
        raise
    done["wall_s"] = time.perf_counter() - start
    return done


class Stopped(Exception):
    """SIGTERM or SIGINT to the driver: the running section's group is killed, what was
    measured is saved, and the driver exits 128 + the signal's number."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum, frame):
    raise Stopped(signum)
