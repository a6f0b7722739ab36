"""Run records: one JSON file per run, written atomically, never overwritten."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import secrets
import signal
import stat
import subprocess
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

from bench.config import ConfigError
from bench.records.schema import problem
from tasks.files import shared_mode, write_atomic

SCHEMA = "icl-bench/run/1"
CHECKPOINT_FORMAT = "icl-bench/checkpoint/1"  # marks checkpoints this runner wrote
CHECKPOINT_KEY = "icl_bench"  # where the run's metadata sits in the Lightning checkpoint
# beside the records: their identities (bench/reports/identities.py)
IDENTITY_INDEX = "identities.json"
# Trainer keys that change neither training nor evaluation: runs differing only in them pool.
# Live validation runs under its own random state (tests/test_validation.py: bit for bit).
RESULT_NEUTRAL = ("progress", "threads", "eval_batch_size", "log_every", "checkpoint_every",
                  "logger", "loader_workers", "save_weights", "val_every", "val_sequences")
# Lightning's spellings of a precision (trainer.precision=32 trains as, and records, "32-true").
PRECISION_ALIASES = {"32": "32-true", "64": "64-true", "16": "16-mixed", "bf16": "bf16-mixed"}


class SignalAfterRecord(Exception):
    """A signal came while a run's `ok` record was written: the record is complete, and the
    process stops (exit 128 + signal) as the signal asked."""

    def __init__(self, signum: int, path: str):
        self.signum, self.path = signum, path
        super().__init__(f"interrupted ({signal.Signals(signum).name}) after the run finished; "
                         f"its record is complete: {path}")


class RunFailed(RuntimeError):
    """A run that started and did not finish: its `failed` record is written (at `path`, or
    nowhere on a non-zero rank). `exit_code` is the process's exit status: 1, or 128 + signal
    number for an interrupted run."""

    def __init__(self, reason: str, path: str | None, exit_code: int = 1):
        super().__init__(reason)
        self.reason, self.path, self.exit_code = reason, path, exit_code
REPO = Path(__file__).resolve().parents[2]


# The code that shapes results: a commit that changed only other files (README, results, tests)
# runs the same code, and its records pool with the previous commit's (bench/reports/selection.py).
CODE_PATHS = ("bench", "tasks", "models", "conf", "pyproject.toml")
# ...less what only reads records or lists runs: editing a claim's rule, a suite's list or the
# leaderboard's layout changes no result, so a suite run over several sessions stays one version.
DOWNSTREAM_PATHS = ("conf/papers", "conf/suite",
                    # what reads records: claims, leaderboard, compare, plots, and the
                    # behavioural identity (it measures the code, it shapes no result)
                    "bench/reports",
                    # speed benchmarks and the GPU checks: they time runs, they make none (the
                    # layers keep training/ from importing them: tests/test_imports.py)
                    "bench/perf",
                    # where bench/reports' modules lived before it (old commits' code digests)
                    "bench/claims", "bench/leaderboard.py", "bench/compare.py",
                    "bench/report.py", "bench/plot.py", "bench/identity.py",
                    "bench/identities.py",
                    # where claims and paper suites lived before conf/papers/: old commits
                    "conf/claims", "bench/claims.py")


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              timeout=5, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return done.stdout if done.returncode == 0 else None


def in_own_checkout() -> bool:
    """Whether REPO is the top of a git checkout. An installed copy (site-packages inside some
    other repository) must not report that repository's commit or history."""
    top = _git("rev-parse", "--show-toplevel")
    try:
        return top is not None and Path(top.strip()).resolve() == REPO.resolve()
    except OSError:
        return False


def ancestors() -> list[str]:
    """The commits of this checkout's history, HEAD first; empty when it is not one."""
    return (_git("rev-list", "HEAD") or "").split() if in_own_checkout() else []


def _shapes_results(path: str) -> bool:
    return not any(path == d or path.startswith(d + "/") for d in DOWNSTREAM_PATHS)


def is_object_name(commit: str) -> bool:
    """A full commit hash (SHA-1, or SHA-256 in a repository of that format), as provenance()
    records it; not a ref, an abbreviation or an expression git would resolve today."""
    return re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", commit) is not None


def code_digest(commit: str | None) -> str | None:
    """A digest of the files of CODE_PATHS but DOWNSTREAM_PATHS at commit (git's own hashes of
    their contents): equal for two commits exactly when that code is equal. None when git cannot
    tell (not a checkout, an unknown commit), and for anything but a full object name: a record's
    "HEAD" or "main" would name whatever is checked out today, not the code that ran."""
    if not commit or not is_object_name(commit):
        return None
    listing = _git("ls-tree", "-r", "--full-tree", f"{commit}^{{commit}}", "--", *CODE_PATHS)
    if listing is None:  # not a commit of this repository
        return None
    files = [line for line in listing.splitlines() if _shapes_results(line.split("\t", 1)[-1])]
    if not files:
        return None
    return hashlib.sha1("\n".join(files).encode()).hexdigest()[:12]


def provenance() -> dict:
    """The code version a run used: `commit` (HEAD of this checkout), `code` (its code_digest)
    and `dirty` (whether the code that shapes results, CODE_PATHS but DOWNSTREAM_PATHS, differed
    from it, untracked files included); both None when this is not a git checkout or git cannot tell.
    Never raises and never waits long: each git call has a timeout, any failure means unknown."""
    ours = in_own_checkout()
    commit = dirty = None
    if ours:
        commit = (_git("rev-parse", "--verify", "HEAD") or "").strip() or None
        # --no-optional-locks: parallel runs must not fight over (or leave) .git/index.lock
        status = _git("--no-optional-locks", "status", "--porcelain", "--", *CODE_PATHS,
                      *(f":(exclude){path}" for path in DOWNSTREAM_PATHS))
        dirty = None if commit is None or status is None else bool(status.strip())
    try:
        version = metadata.version("icl-bench")
    except Exception:  # a broken installation leaves the version unknown, not the run failed
        version = None
    import torch
    return {"commit": commit, "code": code_digest(commit) if ours else None, "dirty": dirty,
            "version": version, "torch": torch.__version__}


# How torch's OpenMP threads wait between ops (bench/cli/openmp.py sets them; a user may): they
# move a CPU run's wall times by a third and none of its numbers
THREAD_WAIT_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def thread_wait() -> dict[str, str]:
    """The thread-wait settings this process's environment holds (the OpenMP runtime read them
    when torch loaded)."""
    return {key: os.environ[key] for key in THREAD_WAIT_KEYS if key in os.environ}


@functools.cache
def code_of_this_process() -> dict:
    """provenance() as it was at this process's first run: the code a suite's later runs execute
    is what was loaded then, whatever the checkout holds (a new commit, an edit) by the time they
    start, so every record of the process names that code."""
    return provenance()


def new_run_id(task: str, model: str, seed: int, evaluation: bool = False) -> str:
    """<task>--<model>--s<seed>--[eval--]<time stamp>-<6 hex>: an evaluation of saved weights
    (python -m bench eval) says so in its name, so no glob of training runs picks it up."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    kind = "eval--" if evaluation else ""
    return f"{run_id_prefix(task, model, seed)}{kind}{stamp}-{secrets.token_hex(3)}"


def run_id_prefix(task: str, model: str, seed: int) -> str:
    """How every run id of this task, model and seed begins (new_run_id; named_pair reads it)."""
    return f"{task}--{model}--s{seed}--"


def json_safe(value):
    """value with every non-finite float replaced by the string "NaN", "Infinity" or
    "-Infinity" (tuples become lists), so strict JSON can hold it."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def write_record(out_dir: str | Path, record: dict) -> Path:
    """Write record as out_dir/<run_id>.json via a temporary file and an atomic link: the file
    appears whole or not at all, and an existing record is never overwritten (FileExistsError).

    The file is strict JSON: a non-finite float anywhere in the record (a diverged loss, an
    infinite reference loss) is stored as the string "NaN", "Infinity" or "-Infinity". The
    temporary `.tmp-*` file is removed whatever happens, also when encoding fails."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{record['run_id']}.json"
    if path.exists():
        raise FileExistsError(f"{path} exists; run records are never overwritten")
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(json_safe(record), f, indent=1, allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, shared_mode())
        try:
            os.link(tmp, path)  # fails if path exists: a concurrent writer cannot be overwritten
        except FileExistsError:
            raise FileExistsError(f"{path} exists; run records are never overwritten") from None
        except OSError:  # a file system without hard links
            os.replace(tmp, path)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    return path


def output_path(out: str, name: str = "out") -> Path:
    """out= of a generated report (leaderboard, claims, speed), or another file a command will
    write (`name` says which, in the messages): a file name in an existing directory, naming
    nothing or a regular file. The report replaces the file whole (a rename), so a symlink would
    become a file and a FIFO or a device node would be replaced: refused."""
    if not out:
        raise ConfigError("out= needs a file name")
    out_path = Path(out)
    try:
        if out_path.is_dir():
            raise ConfigError(f"{name} '{out}' is a directory; "
                              + ("give a file name" if name == "out" else "it must be a file"))
        if not out_path.resolve().parent.is_dir():
            raise ConfigError(f"{name} '{out}': directory {out_path.parent} does not exist")
        not_plain = not_a_regular_file(out_path)
        if not_plain:
            raise ConfigError(f"{name} '{out}' is {not_plain}; reports are written only as "
                              "regular files: give the path of one, or of none yet")
        # a byte written and synced where the report will go: a read-only or full file system
        # is one line now, not an error after the figures were drawn
        with tempfile.NamedTemporaryFile(dir=out_path.resolve().parent, prefix=".tmp-probe-") \
                as probe:
            probe.write(b"\0")
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as error:
        raise ConfigError(f"{name} '{shorten(out)}' cannot be written: "
                          f"{error.strerror or error}") from None
    return out_path


def shorten(path: str, keep: int = 120) -> str:
    """A path for a one-line message: a 5,000-byte one cut in the middle."""
    return path if len(path) <= keep else f"{path[:keep // 2]}...{path[-keep // 2:]}"


def not_written(out, error: OSError) -> ConfigError:
    """What a report writer raises when the destination fails after the checks of output_path
    (the disk filled up meanwhile): one line, and the writer has removed what it made."""
    return ConfigError(f"{shorten(str(out))} not written: {error.strerror or error}")


def not_a_regular_file(path: Path, folder: bool = False) -> str:
    """What path is when it is neither absent nor a regular file (a plain folder with
    `folder`): "a symlink", "a FIFO", "a device", ...; "" otherwise."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return ""
    if (stat.S_ISDIR if folder else stat.S_ISREG)(mode):
        return ""
    kinds = [(stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
             (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"),
             (stat.S_ISREG, "a file")]
    return next(name for test, name in kinds if test(mode))


def write_json(path: str | Path, value) -> Path:
    """value as strict JSON at path, written whole (write_atomic); an existing file is
    replaced."""
    path = Path(path)
    text = json.dumps(json_safe(value), indent=1, allow_nan=False)
    write_atomic(path, lambda tmp: Path(tmp).write_text(text))
    return path


def read_records(out_dir: str | Path, runs_of: set[tuple[str, str]] | None = None
                 ) -> tuple[list[dict], list[tuple[str, str]]]:
    """The run records in out_dir (each with `_path`), and (path, reason) for every *.json file
    that is not one: not valid JSON, not a JSON object, or another schema. Callers report the
    latter; nothing is skipped silently. Hidden files are write_record's temporaries;
    IDENTITY_INDEX is the folder's identity index (bench/reports/identities.py), not a record.
    runs_of: files named as runs of other (task, model) pairs (new_run_id) are not read, for a
    caller that keeps no other record anyway: results/ is 180 MB of JSON, 7 s to read. A file
    named otherwise (a record renamed by hand) is read: its content says whose run it is."""
    records, bad = [], []
    read = None if runs_of is None else {*runs_of, None}  # None: a name of no run
    for path in sorted(Path(out_dir).glob("*.json")):
        if path.name.startswith(".") or path.name == IDENTITY_INDEX or not path.is_file():
            continue
        if read is not None and named_pair(path.name) not in read:
            continue
        record, reason = read_record(path)
        if record is None:
            bad.append((str(path), reason))
        else:
            records.append(record)
    return records, bad


def named_pair(file_name: str) -> tuple[str, str] | None:
    """(task, model) of a file named as a run (new_run_id: <task>--<model>--s<seed>--...), else
    None."""
    parts = file_name.split("--")
    if len(parts) >= 4 and parts[2][:1] == "s" and parts[2][1:].isdigit():
        return parts[0], parts[1]
    return None


def read_record(path: Path) -> tuple[dict | None, str]:
    """The run record at path (with `_path`), or None and why it is not one or cannot be right
    (bench.records.schema.problem: the field and what is wrong with it)."""
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None, "not valid JSON"
    except RecursionError:
        return None, "JSON nested too deeply to be a record"
    except OSError as error:
        return None, f"cannot be read ({error.strerror or error})"
    if not isinstance(record, dict):
        return None, "not a JSON object"
    if record.get("schema") != SCHEMA:
        return None, f"schema {record.get('schema')!r}, expected {SCHEMA!r}"
    why = problem(record)  # one check for every reader: a record that cannot be right is out
    if why:
        return None, why
    record["_path"] = str(path)
    return record, ""


def _same(have, want) -> bool:
    if isinstance(want, bool) or isinstance(have, bool):
        return type(want) is type(have) and want == have
    if isinstance(want, (int, float)) and isinstance(have, (int, float)):
        return math.isclose(float(have), float(want), rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(want, (list, tuple)) and isinstance(have, (list, tuple)):
        return len(want) == len(have) and all(_same(h, w) for h, w in zip(have, want))
    return have == want


def config_matches(recorded, obj, skip=()) -> bool:
    """recorded (a record's resolved config) equals the dataclass obj field by field; a field the
    record lacks (it predates the field) counts as the field's default."""
    if not isinstance(recorded, dict):
        return False
    for f in dataclasses.fields(obj):
        if f.name in skip:
            continue
        have = recorded.get(f.name, _default(f))
        if have is dataclasses.MISSING or not _same(have, getattr(obj, f.name)):
            return False
    return True


def _default(f: dataclasses.Field):
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default  # MISSING where the field has no default


def with_defaults(recorded: dict, schema: type | None) -> dict:
    """recorded (a record's resolved config) with the fields it lacks because it predates them
    filled with their defaults, as config_matches reads it: a config written before a field was
    added is the same config as one written after, with that field at its default."""
    if schema is None:
        return dict(recorded)
    filled = {f.name: _default(f) for f in dataclasses.fields(schema)}
    filled = {k: v for k, v in filled.items() if v is not dataclasses.MISSING}
    return {**filled, **recorded}


def record_matches(record: dict, config) -> bool:
    """The record ran config (a bench.config.RunConfig): same task, model and trainer settings,
    the result-neutral trainer keys aside. Seeds and held-out sizes are the caller's to compare."""
    return (record["task"]["name"] == config.task_name
            and record["model"]["name"] == config.model_name
            and config_matches(record["task"]["config"], config.task)
            and config_matches(record["model"]["config"], config.model)
            and config_matches(record["trainer"]["config"], config.trainer, RESULT_NEUTRAL))


class Environment(NamedTuple):
    """What a run trained on beyond its config: `trainer.accelerator=auto` and `model.kernel=auto`
    resolve differently on a CPU and a GPU, and a GPU's numerics differ from a CPU's, so records of
    different environments never pool and never stand in for one another."""
    device: str  # "cpu" (all CPUs are one kind), or the type and name: "cuda: NVIDIA H100 ..."
    kernel: str | None  # the SSD scan that ran; None for models without one
    precision: str | None
    compile: bool
    tf32: bool

    @property
    def default(self) -> bool:
        """A CPU run: there its config decides the kernel, precision and compile, so a label of
        the config already says all there is."""
        return self.device == "cpu"

    @property
    def machine(self) -> Environment:
        """What all records behind one verdict share (bench.reports.claims): the device and its
        matmul mode. The kernel is the model's (a transformer has none); precision and compile are
        the trainer config's, which a claim's selectors choose."""
        return Environment(self.device, None, None, False, self.tf32)

    @property
    def name(self) -> str:
        """Where it ran, for a reader: "cpu", or e.g. "cuda: NVIDIA H100 80GB HBM3, mamba_ssm"."""
        if self.default:
            return self.device
        return ", ".join([self.device, *([self.kernel] if self.kernel else []),
                          *(["tf32"] if self.tf32 else [])])


def make_environment(device: str, device_name: str, kernel: str | None, precision: str | None,
                     compile: bool, tf32: bool) -> Environment:
    """The Environment of these facts: the device kind named by its GPU, precision aliases
    resolved, TF32 only where it exists (CUDA)."""
    cpu = device == "cpu"
    kind = device if cpu or device_name == device else f"{device}: {device_name}"
    return Environment(kind, kernel, PRECISION_ALIASES.get(precision, precision), bool(compile),
                       bool(tf32) and not cpu)  # TF32 is a CUDA matmul mode: no-op on a CPU


def environment(record: dict) -> Environment:
    """The environment a record's run trained in (its `train` part). Older records lack fields:
    no device is the CPU, no device_name is the device type ("cuda"), no tf32 is false, no
    precision or compile is the trainer config's, and no kernel is the model config's (`auto` is
    torch on the CPU; on a GPU it stays `auto`, as which one ran is unknown)."""
    train = record.get("train") or {}
    trainer = record["trainer"]["config"]
    device = str(train.get("device") or "cpu").split(":", 1)[0]
    if "kernel" in train:
        kernel = train["kernel"]
    else:
        import torch

        from models.ssd import KERNELS, resolve_kernel
        kernel = record["model"]["config"].get("kernel")
        if device == "cpu" and kernel in KERNELS:
            kernel = resolve_kernel(kernel, torch.device("cpu"))
    return make_environment(device, train.get("device_name") or device, kernel,
                        train.get("precision", trainer.get("precision")),
                        train.get("compile", trainer.get("compile", False)),
                        train.get("tf32", False))
