"""Run records: one JSON file per run, written atomically, never overwritten."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import tempfile
import time
from importlib import metadata
from pathlib import Path

SCHEMA = "icl-bench/run/1"


class RunFailed(RuntimeError):
    """A run that started and did not finish: its `failed` record is written (at `path`, or
    nowhere on a non-zero rank). `exit_code` is the process's exit status: 1, or 128 + signal
    number for an interrupted run."""

    def __init__(self, reason: str, path: str | None, exit_code: int = 1):
        super().__init__(reason)
        self.reason, self.path, self.exit_code = reason, path, exit_code
REPO = Path(__file__).resolve().parents[1]


def provenance() -> dict:
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    try:
        version = metadata.version("icl-bench")
    except metadata.PackageNotFoundError:
        version = None
    import torch
    return {"commit": commit, "version": version, "torch": torch.__version__}


def new_run_id(task: str, model: str, seed: int) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{task}--{model}--s{seed}--{stamp}-{secrets.token_hex(3)}"


def write_record(out_dir: str | Path, record: dict) -> Path:
    """Write record as out_dir/<run_id>.json via a temporary file and an atomic rename."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{record['run_id']}.json"
    if path.exists():
        raise FileExistsError(f"{path} exists; run records are never overwritten")
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=1, allow_nan=False)
    os.replace(tmp, path)
    return path


def read_records(out_dir: str | Path) -> list[dict]:
    records = []
    for path in sorted(Path(out_dir).glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and record.get("schema") == SCHEMA:
            record["_path"] = str(path)
            records.append(record)
    return records
