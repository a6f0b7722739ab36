"""tasks/processes.py: jobs computed in worker processes come back as computed in the caller, in
order; a worker's error or death is one line raised in the caller, and no worker outlives the
call."""
import os
import time

import pytest

from tasks.processes import WorkerFailed, map_in_processes


def power(base, exponent):
    return base ** exponent, os.getpid()


def fails(value):
    if value == 2:
        raise ValueError(f"no {value}\nsecond line")
    return value


def dies(value):
    if value == 3:
        os._exit(7)  # a worker killed mid-job: no result, no Python error
    return value


def naps(seconds):
    time.sleep(seconds)
    return seconds


def test_the_results_are_the_jobs_in_order_from_processes_of_their_own():
    jobs = [(base, 3) for base in range(5)]
    results = map_in_processes(power, jobs, 2)
    assert [value for value, _ in results] == [base ** 3 for base in range(5)]
    pids = [pid for _, pid in results]
    assert os.getpid() not in pids
    assert len(set(pids)) == 2 and pids[:3] == [pids[0]] * 3  # contiguous runs: 3 and 2


@pytest.mark.parametrize("function, message", [
    (fails, "a worker process failed: ValueError: no 2"),
    (dies, "a worker process ended without its results (exit code 7)")])
def test_a_worker_that_fails_or_dies_is_one_line_raised_in_the_caller(function, message):
    """One worker, its fourth job (a process costs seconds of imports)."""
    with pytest.raises(WorkerFailed) as raised:
        map_in_processes(function, [(value,) for value in range(4)], 1)
    assert str(raised.value) == message


def test_a_worker_imports_the_modules_the_caller_imported(tmp_path, monkeypatch):
    """A checkout in the working directory does not shadow them (a worker started with that
    directory in front of sys.path imported another tree's tasks), and a worker whose module
    is another file than the caller's refuses to run it."""
    decoy = "def power(base, exponent):\n    return 'decoy', 0\n"
    (tmp_path / "test_processes.py").write_text(decoy)
    monkeypatch.chdir(tmp_path)
    assert [value for value, _ in map_in_processes(power, [(2, 3)], 1)] == [8]
    monkeypatch.setattr("tasks.processes.module_file", lambda function: "/elsewhere.py")
    with pytest.raises(WorkerFailed, match="ImportError: the worker's test_processes is .*, the "
                                           "caller's /elsewhere.py"):
        map_in_processes(power, [(2, 3)], 1)


def test_no_worker_outlives_an_interrupted_wait(monkeypatch):
    """Whatever ends the wait (here an exception while reading, as Ctrl-C or a signal turned
    into an exception would) ends the workers too."""
    started = []
    real_popen = __import__("subprocess").Popen

    class Recorded(real_popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)
            self.stdout.read = self.interrupted

        def interrupted(self):
            raise KeyboardInterrupt

    monkeypatch.setattr("tasks.processes.subprocess.Popen", Recorded)
    begun = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        map_in_processes(naps, [(60,), (60,)], 2)
    assert time.perf_counter() - begun < 30
    assert len(started) == 2 and all(worker.poll() is not None for worker in started)
