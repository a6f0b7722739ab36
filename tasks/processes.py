"""Independent jobs computed in worker processes of their own, one thread each.

A reference whose tensor operations are small is bound by dispatch, which the GIL serialises:
torch's intra-op threads leave it where it was (lgssm's SMC on 128 sequences: 16.1 s on two
threads, 16.7 s on one, on the 2-core machine of docs/profile-cpu-step.md). Its jobs share
nothing, so a process per core computes them side by side.

A worker is a fresh interpreter (`python -c`), not a fork: a fork of a process that has run
threads (torch's pool, Lightning's) may deadlock, and multiprocessing's "spawn" would run the
caller's script again in the worker, which a script without an `if __name__ == "__main__"`
guard does not survive. It starts by importing torch (about 1.5 s), which is why callers use
workers only for work of many seconds.

A worker gets the caller's sys.path exactly, not behind its working directory, where a checkout
would shadow the modules the caller imported (it checks the function's). Its jobs come pickled
on stdin (tensors by value), and its results go back pickled on stdout, which nothing else
writes: its fd 1 is pointed at stderr once it holds the pipe. It runs in a session of its own,
so Ctrl-C reaches the caller alone, and the caller ends it whatever ends the wait. A failure in
a worker comes back as one line, raised here; a worker that dies without its results (killed,
out of memory) is reported with its exit code."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
from typing import Any, Callable

import torch


class WorkerFailed(RuntimeError):
    """A worker process raised, or ended without sending its results."""


def map_in_processes(function: Callable[..., Any], jobs: list[tuple], processes: int
                     ) -> list[Any]:
    """[function(*job) for job in jobs], the jobs shared out in contiguous runs among at most
    `processes` worker processes of one thread each; function must be importable (defined at
    a module's top level) and the jobs and results picklable."""
    share = -(-len(jobs) // max(1, processes))
    parts = [jobs[start:start + share] for start in range(0, len(jobs), share)]
    # the caller's sys.path exactly, in place of the one `-c` begins with (the working directory
    # in front), so that the worker imports the modules the caller did: serve checks the
    # function's
    boot = f"import sys; sys.path[:] = {sys.path!r}; from tasks.processes import serve; serve()"
    source = module_file(function)
    workers = []
    try:
        for _ in parts:  # all started before any is fed: their imports overlap
            workers.append(subprocess.Popen([sys.executable, "-c", boot],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            start_new_session=True))
        for worker, part in zip(workers, parts):
            try:
                worker.stdin.write(pickle.dumps((function, source, part)))
                worker.stdin.close()
            except BrokenPipeError:  # it died first: its exit code is reported below
                pass
        results = []
        for worker in workers:  # independent: read one to its end, then the next
            payload = worker.stdout.read()
            code = worker.wait()
            try:
                done, value = pickle.loads(payload)
            except (EOFError, pickle.UnpicklingError):
                raise WorkerFailed(f"a worker process ended without its results (exit code "
                                   f"{code})") from None
            if not done:
                raise WorkerFailed(f"a worker process failed: {value}")
            results += value
        return results
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
            worker.wait()
            for pipe in (worker.stdin, worker.stdout):
                pipe.close()


def serve() -> None:
    """A worker's life: read its function and jobs, compute them one after another on one
    thread, and send the results (or the first error, as one line) back."""
    results = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever else writes to stdout goes to stderr, not into the results
    try:
        function, source, jobs = pickle.loads(sys.stdin.buffer.read())
        if module_file(function) != source:
            raise ImportError(f"the worker's {function.__module__} is {module_file(function)}, "
                              f"the caller's {source}")
        torch.set_num_threads(1)
        message = (True, [function(*job) for job in jobs])
    except Exception as error:  # reported to the caller, which raises it
        lines = str(error).splitlines()
        message = (False, f"{type(error).__name__}: {lines[0] if lines else ''}")
    results.write(pickle.dumps(message))
    results.close()


def module_file(function: Callable[..., Any]) -> str | None:
    """The file of the module that defines function, as this process imported it."""
    return getattr(sys.modules.get(function.__module__), "__file__", None)


def host_available_bytes() -> int | None:
    """The node's available RAM (MemAvailable: free memory and what the page cache would give
    up), else its free pages; None when neither can be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
