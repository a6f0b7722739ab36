"""Suites and sweeps over several processes: `launcher=local workers=N` on this machine, and
`launcher=slurm` as a SLURM job array through submitit. The default, `launcher=local` with one
worker, is the sequential runner of bench/cli/suites.py.

Every worker (a process here, an array task there) goes through the entries in its own order and
runs each one that is neither finished (suites.finished_runs: an ok record, as the sequential
runner skips) nor locked by another living worker (bench/records/locks.py), so two workers, two
launchers, or a launcher and a sequential runner (which takes the same locks) on one out_dir
never run one entry, and records are written as a lone run writes them. A worker killed mid-run
leaves no ok record: its lock dies with it and the entry runs again (here at once, by the worker
that replaces it; on SLURM in the requeued task), from the interrupted run's newest checkpoint
where its trainer writes them (trainer.checkpoint_every), else from its start. The parent here
pins each worker to a GPU or to its share of the cores, reports progress from the workers'
result files, replaces a worker that dies, and on Ctrl-C or SIGTERM stops them all; a rerun of
the same command completes the rest."""
from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.cli.options import positive_int, take_option
from bench.cli.suites import (entry_prices, finished_runs, finished_since, listings,
                              pricing_folders, print_sweep_table, run_entry)
from bench.config import ConfigError, compose
from bench.records.locks import remove_locks_of, run_lock_key, try_lock
from bench.records.store import RunFailed, SignalAfterRecord

LAUNCHES = ".launch"  # <out_dir>/.launch/<stamp>-<pid>/: the plan, worker logs and results
REPLACEMENTS = 3  # workers that die are replaced at most this many times in all
SLURM_KEYS = ("partition", "time_min", "gpus_per_task", "cpus_per_task", "array_parallelism",
              "tasks", "sbatch")


@dataclass
class Launcher:
    """launcher=local|slurm, workers=N (local), slurm.<key>=value (slurm)."""

    kind: str = "local"
    workers: int = 1
    slurm: dict = field(default_factory=dict)

    @property
    def sequential(self) -> bool:
        return self.kind == "local" and self.workers == 1


def take_launcher(argv: list[str]) -> tuple[list[str], Launcher]:
    """The launcher options of a suite or sweep command line, checked."""
    argv, kind = take_option(argv, "launcher", "local")
    argv, workers = take_option(argv, "workers", None)
    if kind not in ("local", "slurm"):
        raise ConfigError(f"launcher must be local or slurm, got '{kind}'")
    if workers is not None and kind != "local":
        raise ConfigError("workers= is for launcher=local; launcher=slurm runs slurm.tasks= "
                          "array tasks")
    launcher = Launcher(kind, positive_int("workers", workers, high=512) if workers else 1)
    rest = []
    for arg in argv:
        key, _, value = arg.partition("=")
        if not key.startswith("slurm."):
            rest.append(arg)
            continue
        name = key[len("slurm."):]
        if kind != "slurm":
            raise ConfigError(f"{key} is an option of launcher=slurm")
        if name not in SLURM_KEYS:
            raise ConfigError(f"unknown key '{key}'; launcher=slurm takes "
                              + ", ".join(f"slurm.{k}" for k in SLURM_KEYS))
        if name in launcher.slurm:
            raise ConfigError(f"'{key}' is given twice; give each key once")
        if name in ("partition", "sbatch"):
            if not value:
                raise ConfigError(f"{key} is empty")
            launcher.slurm[name] = value
        else:
            launcher.slurm[name] = positive_int(key, value, high=10**6)
    return rest, launcher


# --- what a worker runs ------------------------------------------------------------------------
@dataclass
class Plan:
    """The entries of a suite or sweep as composed overrides (each entry's defaults, its own
    settings and the command line's), their numbers, and how they run."""

    what: str
    size: int
    numbers: list[int]
    overrides: list[list[str]]
    origin: str
    rerun: bool

    def configs(self) -> list:
        configs = [compose(overrides) for overrides in self.overrides]
        for config in configs:
            config.origin = self.origin
        return configs


def dispatcher(launcher: Launcher):
    """What suites.run_entries hands its checked entries to: None for the sequential runner,
    else a function that runs them in workers here or submits them to SLURM."""
    if launcher.sequential:
        return None

    def dispatch(what, size, numbers, overrides, origin, rerun, out_dirs) -> int:
        plan = Plan(what, size, numbers, overrides, origin, rerun)
        if launcher.kind == "slurm":
            return launch_slurm(plan, launcher.slurm, out_dirs)
        return launch_local(plan, launcher.workers, out_dirs)
    return dispatch


def work(plan: Plan, index: int, folder: Path, workers: int = 1,
         stop_signals: tuple = ()) -> int:
    """A worker (number `index` of `workers`): each entry, in an order that starts at this
    worker's share of them (so workers rarely meet at a lock), unless it is finished (an ok
    record skipped as the sequential runner skips it, or settled by another worker of this
    launch) or another worker holds it; one JSON line per entry it settles, in
    `folder`/results-<index>.jsonl. An entry whose earlier run was interrupted goes on from
    that run's newest checkpoint (suites.interrupted_checkpoint) unless the plan reruns.
    Returns 0, or the exit status of an interrupted run (the worker stops there; its entry is
    not settled). `stop_signals`: see run_entry."""
    results = folder / f"results-{index}.jsonl"
    configs = plan.configs()
    order = list(range(len(configs)))
    start = (index * len(order)) // max(1, workers) % max(1, len(order))
    order = order[start:] + order[:start]

    def settle(i: int, status: str, path: str, seconds: float | None = None) -> None:
        entry = {"number": plan.numbers[i], "status": status, "path": path, "worker": index,
                 "pid": os.getpid()}
        if seconds is not None:  # how long it ran here: the launcher's estimate reads it
            entry["seconds"] = round(seconds, 3)
        line = json.dumps(entry)
        with open(results, "a") as handle:  # one short line: appended whole
            handle.write(line + "\n")

    def finished(i: int) -> bool:
        if plan.numbers[i] in read_results(folder):  # settled in this launch (a failed run too)
            return True
        path = "" if plan.rerun else finished_since(configs[i], listed[configs[i].out_dir])
        if path:
            settle(i, "done already", path)
        return bool(path)

    # what is finished at the start, in one reading of the out_dirs (not one an entry); what
    # another launcher finishes later is a new file (finished_since)
    listed = listings(configs)
    done = {} if plan.rerun else finished_runs(configs)
    settled = read_results(folder)
    for i, path in done.items():
        if plan.numbers[i] not in settled:
            settle(i, "done already", path)
    pending = [i for i in order if i not in done]
    while pending:
        held_elsewhere = []
        for i in pending:
            config = configs[i]
            if plan.numbers[i] in read_results(folder):
                continue
            lock = try_lock(config.out_dir, run_lock_key(config))
            if lock is None:  # another worker runs it, maybe another launcher's: seen again
                held_elsewhere.append(i)  # when it lets go (done, or to run if it failed)
                continue
            with lock:
                if finished(i):  # settled meanwhile, before this worker took the lock
                    continue
                print(f"[{plan.numbers[i]}/{plan.size}] {' '.join(plan.overrides[i])}",
                      flush=True)
                began = time.monotonic()
                try:
                    status, path = run_entry(config, stop_signals=stop_signals,
                                             resume=not plan.rerun)
                except RunFailed as error:  # interrupted: the entry is free again; stop here
                    return error.exit_code
                except SignalAfterRecord as error:  # its record is whole: settled, then stop
                    settle(i, "ok", error.path, time.monotonic() - began)
                    return 128 + error.signum
                settle(i, status, path, time.monotonic() - began)
        pending = held_elsewhere
        if pending:
            time.sleep(1.0)
    return 0


# --- launcher=local workers=N --------------------------------------------------------------------
def worker_environments(workers: int) -> list[dict[str, str]]:
    """Each worker's environment: its own GPU (CUDA_VISIBLE_DEVICES) where there are GPUs, else
    its own share of this process's cores (the affinity mask, OMP_NUM_THREADS): no worker
    oversubscribes another."""
    import torch
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus:
        if workers > gpus:
            raise ConfigError(f"workers={workers} but {gpus} GPU(s) are visible: one worker per "
                              "GPU")
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        names = visible.split(",") if visible else [str(i) for i in range(gpus)]
        return [{"CUDA_VISIBLE_DEVICES": names[i]} for i in range(workers)]
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else list(range(os.cpu_count() or 1))
    share = len(cores) // workers
    if share == 0:
        raise ConfigError(f"workers={workers} on {len(cores)} core(s): at most one worker per "
                          "core")
    return [{"BENCH_WORKER_CPUS": ",".join(map(str, cores[i * share:(i + 1) * share])),
             "OMP_NUM_THREADS": str(share), "MKL_NUM_THREADS": str(share)}
            for i in range(workers)]


def launch_dir(plan: Plan, out_dir: str) -> Path:
    folder = Path(out_dir) / LAUNCHES / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "plan.json").write_text(json.dumps(asdict(plan)))
    return folder


def read_results(folder: Path) -> dict[int, dict]:
    """The entries the workers settled so far, by number (the last line of each wins)."""
    settled = {}
    for path in sorted(folder.glob("results-*.jsonl")):
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    entry = json.loads(line)
                    settled[entry["number"]] = entry
    return settled


class Stop(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def launch_local(plan: Plan, workers: int, out_dirs: list[str]) -> int:
    """Run the plan in `workers` worker processes; returns the exit status of the whole."""
    environments = worker_environments(workers)
    configs = plan.configs()  # priced before any worker starts: a failure leaves no orphan
    share = int(environments[0].get("OMP_NUM_THREADS", 0)) or None
    prices = [found.seconds for found in
              entry_prices(configs, share, pricing_folders(configs))[0]]
    families = [config.task_name for config in configs]
    folder = launch_dir(plan, out_dirs[0])
    pinned = ("GPU " + ", ".join(e["CUDA_VISIBLE_DEVICES"] for e in environments)
              if "CUDA_VISIBLE_DEVICES" in environments[0]
              else "cores " + " | ".join(e["BENCH_WORKER_CPUS"] for e in environments))
    print(f"{plan.what}: {len(plan.numbers)} entries on {workers} workers ({pinned}); their "
          f"logs: {folder}", flush=True)

    def start(slot: int) -> subprocess.Popen:
        with open(folder / f"worker-{slot}.log", "a") as log:  # the worker keeps its own copy
            return subprocess.Popen(
                [sys.executable, "-m", "bench.cli.worker", str(folder), str(slot), str(workers)],
                env={**os.environ, **environments[slot]}, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)  # a terminal's Ctrl-C reaches the parent alone

    def on_signal(signum, frame):
        raise Stop(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    procs = {slot: start(slot) for slot in range(workers)}
    replaced, progress = 0, Progress(plan, prices=prices, families=families)
    try:
        while procs:
            time.sleep(0.5)
            settled = read_results(folder)
            for slot, proc in list(procs.items()):
                code = proc.poll()
                if code is None:
                    continue
                del procs[slot]
                if code != 0:  # died (killed, out of memory): its entry is free again now
                    remove_locks_of(out_dirs, proc.pid)
                    left = len(plan.numbers) - len(settled)
                    if left and replaced < REPLACEMENTS:
                        replaced += 1
                        progress.say(f"worker {slot} (pid {proc.pid}) ended with status {code}; "
                                     f"replaced ({replaced} of at most {REPLACEMENTS})")
                        procs[slot] = start(slot)
            progress.show(settled, len(procs))
        progress.close()
    except Stop as stop:
        progress.close()
        print(f"stopping: {signal.Signals(stop.signum).name}; the workers are told to stop",
              flush=True)
        for proc in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        for proc in procs.values():
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            remove_locks_of(out_dirs, proc.pid)
        print(f"stopped; {progress.line(read_results(folder), 0)}; the same command goes on "
              "from there", flush=True)
        return 128 + stop.signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return finish(plan, read_results(folder))


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 600 else f"{seconds / 60:.0f} min"


class Progress:
    """The launcher's account of the workers: entries settled (ok or done already, failed),
    workers running, time so far and an estimate of the time left (the prices of the entries
    left, bench/reports/costs.py read from records, scaled by what their task family's runs here
    took over their prices and shared by the workers running). On a terminal one line with a
    bar, redrawn in place; elsewhere (a log file) a line whenever an entry settles or a worker
    ends."""

    WIDTH = 24

    def __init__(self, plan: Plan, terminal: bool | None = None,
                 prices: list[float | None] | None = None, families: list[str] | None = None):
        self.plan, self.began, self.shown = plan, time.monotonic(), None
        self.terminal = sys.stdout.isatty() if terminal is None else terminal
        self.drawn = False  # a bar is on the terminal's last line
        # each entry's weight in the estimate: its price where known (a transformer of 3,000
        # steps is not one Mamba of 1,000), else the median price; all alike without prices
        prices = prices or [None] * len(plan.numbers)
        known = [price for price in prices if price is not None]
        fill = statistics.median(known) if known else 1.0
        self.weights = {number: fill if price is None else price
                        for number, price in zip(plan.numbers, prices)}
        # records of other days misprice task families unevenly (an lgssm run whose price
        # included its references, now cached): each family's runs here correct its own prices
        self.families = dict(zip(plan.numbers, families or [""] * len(plan.numbers)))

    def run_left(self, settled: dict) -> tuple[float, float] | None:
        """(the run time the entries left will take, the longest of them), each entry's price
        scaled by what its family's runs here took over their prices (all runs', for a family
        none of whose runs has settled); None before a timed run settles. A failed run is no
        measure of what the others take: it may have stopped at its first step."""
        timed = {n: float(seconds) for n, entry in settled.items()
                 if entry["status"] == "ok" and self.weights.get(n, 0.0) > 0
                 and isinstance(seconds := entry.get("seconds"), (int, float))
                 and not isinstance(seconds, bool) and math.isfinite(seconds) and seconds > 0}
        if not timed:
            return None
        took, priced = {}, {}
        for n, seconds in timed.items():
            family = self.families.get(n, "")
            took[family] = took.get(family, 0.0) + seconds
            priced[family] = priced.get(family, 0.0) + self.weights[n]
        overall = sum(took.values()) / sum(priced.values())
        left = [weight * (took[f] / priced[f] if (f := self.families.get(n, "")) in took
                          else overall)
                for n, weight in self.weights.items() if n not in settled]
        return sum(left), max(left, default=0.0)

    def line(self, settled: dict, running: int) -> str:
        elapsed = time.monotonic() - self.began
        failed = sum(1 for entry in settled.values() if entry["status"] == "failed")
        ran = [n for n, entry in settled.items() if entry["status"] != "done already"]
        total, left = len(self.plan.numbers), len(self.plan.numbers) - len(settled)
        # the run time still to go, shared by the workers running, and at least the longest run
        # left, which no number of workers shares (the wall time so far would count the runs in
        # flight as not begun: twice the time left at the first settle of two workers)
        timed = self.run_left(settled)
        if timed is not None:
            to_go, longest = timed
            seconds = max(to_go / max(1, running), longest)
        else:  # runs settled by workers that do not time them: the wall time so far, by price
            done = sum(self.weights.get(n, 0.0) for n in ran)
            to_go = sum(w for n, w in self.weights.items() if n not in settled)
            seconds = elapsed * to_go / done if done > 0 else None
        estimate = (f"; about {duration(seconds)} left"
                    if seconds is not None and left and running else "")
        return (f"[{len(settled)}/{total} settled: {len(settled) - failed} ok or done already, "
                f"{failed} failed; {running} worker(s) running; {elapsed / 60:.1f} min"
                f"{estimate}]")

    def show(self, settled: dict, running: int) -> None:
        if self.terminal:  # redrawn every call: the clock moves
            done = len(settled) / max(1, len(self.plan.numbers))
            bar = "#" * round(done * self.WIDTH)
            sys.stdout.write(f"\r\x1b[K|{bar:<{self.WIDTH}}| {self.line(settled, running)}")
            sys.stdout.flush()
            self.drawn = True
        elif (len(settled), running) != self.shown:
            print(self.line(settled, running), flush=True)
        self.shown = (len(settled), running)

    def say(self, message: str) -> None:
        """A line of its own, above the bar."""
        self.close()
        print(message, flush=True)

    def close(self) -> None:
        if self.drawn:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self.drawn = False


def finish(plan: Plan, settled: dict) -> int:
    paths = [settled[n]["path"] for n in plan.numbers
             if n in settled and settled[n]["status"] != "failed" and settled[n]["path"]]
    if plan.what == "the sweep" and paths:
        print_sweep_table(paths)
    failed = [n for n in plan.numbers if settled.get(n, {}).get("status") == "failed"]
    missing = [n for n in plan.numbers if n not in settled]
    if failed:
        print(f"error: {len(failed)} of {len(plan.numbers)} runs of {plan.what} failed (entries "
              f"{', '.join(map(str, failed))}); their failed records say why", file=sys.stderr)
    if missing:
        print(f"error: {len(missing)} entries of {plan.what} did not run (entries "
              f"{', '.join(map(str, missing))}): their workers died; the same command runs "
              "them", file=sys.stderr)
    return 1 if failed or missing else 0


# --- launcher=slurm ----------------------------------------------------------------------------
class ArrayTask:
    """What one task of the job array runs (submitit pickles it): a worker over the plan.

    Preemption and the time limit reach a task as submitit's preemption signal (SIGUSR2 unless
    SUBMITIT_PREEMPT_SIGNAL says otherwise; `#SBATCH --signal=USR2@90` before the limit). The
    running entry's run takes it as it takes SIGTERM: it stops at its next step with a failed
    record that says "interrupted (SIGUSR2)", and its entry stays open. The task then hands the
    signal to submitit, which calls `checkpoint` (the same task, resubmitted) and requeues it:
    the requeued task skips what finished and goes on with the interrupted entry from its
    newest checkpoint (trainer.checkpoint_every; from its start where its trainer writes none).
    SLURM sends SIGTERM at a preemption too: a run stopped by it waits PREEMPT_WAIT_S for the
    preemption signal before the task ends (scancel sends SIGTERM alone)."""

    PREEMPT_WAIT_S = 30.0

    def __init__(self, plan: Plan, folder: str, tasks: int):
        self.plan, self.folder, self.tasks = plan, folder, tasks

    def __call__(self, index: int) -> int:
        import submitit
        preempt = getattr(signal, "SIG" + submitit.JobEnvironment.USR_SIG)
        code = work(self.plan, index, Path(self.folder), self.tasks, stop_signals=(preempt,))
        if code == 128 + preempt:  # submitit's handler (ours came off with the run) requeues
            signal.raise_signal(preempt)
        elif code == 128 + signal.SIGTERM:  # a preemption signal meanwhile requeues the task
            time.sleep(self.PREEMPT_WAIT_S)  # (submitit's handler exits from the sleep)
        return code

    def checkpoint(self, index: int):
        import submitit
        return submitit.helpers.DelayedSubmission(self, index)


def require_slurm():
    """submitit, where SLURM's sbatch and srun are on PATH; else one line."""
    try:
        import submitit
    except ImportError:
        raise ConfigError("launcher=slurm needs submitit: pip install -e \".[cluster]\"") from None
    missing = [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None]
    if missing:
        raise ConfigError(f"launcher=slurm needs SLURM's {' and '.join(missing)} on PATH: run it "
                          "on a login node of the cluster")
    return submitit


def slurm_executor(submitit, folder: Path, options: dict, tasks: int):
    executor = submitit.AutoExecutor(folder=folder / "slurm", cluster="slurm")
    parameters = {"timeout_min": options.get("time_min", 240),
                  "slurm_array_parallelism": options.get("array_parallelism", tasks),
                  "cpus_per_task": options.get("cpus_per_task", 2),
                  "gpus_per_node": options.get("gpus_per_task", 0), "tasks_per_node": 1,
                  "nodes": 1}
    if "partition" in options:
        parameters["slurm_partition"] = options["partition"]
    if "sbatch" in options:  # extra #SBATCH lines: "key=value;key=value"
        extra = {}
        for item in options["sbatch"].split(";"):
            key, _, value = item.partition("=")
            extra[key.strip().lstrip("-")] = value.strip()
        parameters["slurm_additional_parameters"] = extra
    executor.update_parameters(**parameters)
    return executor


def launch_slurm(plan: Plan, options: dict, out_dirs: list[str]) -> int:
    """Submit the plan as one job array (slurm.tasks tasks, default one per entry) and return:
    the records arrive in out_dir as the tasks run; the same command later says what is done
    (every finished entry is skipped) and submits what is left."""
    submitit = require_slurm()  # before the launch folder: a refusal leaves nothing behind
    folder = launch_dir(plan, out_dirs[0])
    tasks = min(len(plan.numbers), options.get("tasks", len(plan.numbers)))
    executor = slurm_executor(submitit, folder, options, tasks)
    with executor.batch():
        jobs = [executor.submit(ArrayTask(plan, str(folder), tasks), index)
                for index in range(tasks)]
    array = str(jobs[0].job_id).split("_")[0] if jobs else "?"
    print(f"{plan.what}: {len(plan.numbers)} entries submitted as SLURM job array {array} "
          f"({tasks} tasks); logs and submission scripts in {folder}; the same command again "
          "skips what has finished")
    return 0


def pin_cores() -> None:
    """A worker started by launch_local keeps to its share of the cores (BENCH_WORKER_CPUS)."""
    cpus = os.environ.get("BENCH_WORKER_CPUS")
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
