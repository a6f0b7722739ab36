"""The training log as one CSV file, `<log_dir>/metrics.csv`, behind Lightning's public `Logger`
interface: a row per logged step, written at once (a run that fails leaves the steps it did),
its columns the sorted metric names and `step`; `hparams.yaml` beside it. A resumed run
continues the file of the run it resumes: the rows of the steps before its checkpoint stay, the
later ones go (it trains those steps again)."""
from __future__ import annotations

import csv
import math
import os
from argparse import Namespace
from pathlib import Path

import yaml
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only

from tasks.files import write_atomic

METRICS_FILE = "metrics.csv"
HPARAMS_FILE = "hparams.yaml"


class RunCSVLogger(Logger):
    """`log_dir/metrics.csv` without Lightning's version subdirectories. Set `keep_before` (the
    step a resumed run goes on from) before the first row is logged."""

    def __init__(self, log_dir: str):
        super().__init__()
        self._log_dir = os.path.normpath(log_dir)
        self.keep_before = 0
        self._keys: list[str] | None = None  # the file's columns, once it has been continued

    @property
    def name(self) -> str:
        return os.path.basename(self._log_dir)

    @property
    def version(self) -> str:
        return ""

    @property
    def root_dir(self) -> str:
        return os.path.dirname(self._log_dir)

    @property
    def log_dir(self) -> str:
        return self._log_dir

    @property
    def metrics_file_path(self) -> str:
        return os.path.join(self._log_dir, METRICS_FILE)

    @rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs) -> None:
        params = vars(params) if isinstance(params, Namespace) else dict(params)
        os.makedirs(self._log_dir, exist_ok=True)
        text = yaml.safe_dump(params, sort_keys=False)
        write_atomic(Path(self._log_dir) / HPARAMS_FILE, lambda tmp: Path(tmp).write_text(text))

    @rank_zero_only
    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        row = {name: scalar(value) for name, value in metrics.items()}
        row["step"] = step
        if self._keys is None:
            self._keys = self._continue()
        if set(row) - set(self._keys):  # a new column: the header changes, write it all again
            self._keys = sorted(set(self._keys) | set(row))
            self._rewrite([*self._rows(), row])
            return
        with open(self.metrics_file_path, "a", newline="") as file:
            csv.DictWriter(file, fieldnames=self._keys).writerow(row)

    def _continue(self) -> list[str]:
        """The columns of the file this run continues, keeping only its rows before
        keep_before; none when there is no file yet."""
        os.makedirs(self._log_dir, exist_ok=True)
        if not os.path.isfile(self.metrics_file_path):
            return []
        with open(self.metrics_file_path, newline="") as file:
            reader = csv.DictReader(file)
            keys = sorted(reader.fieldnames or [])
            kept = [row for row in reader if row_step(row) < self.keep_before]
        self._keys = keys
        self._rewrite(kept)
        return keys

    def _rows(self) -> list[dict]:
        if not os.path.isfile(self.metrics_file_path):
            return []
        with open(self.metrics_file_path, newline="") as file:
            return list(csv.DictReader(file))

    def _rewrite(self, rows: list[dict]) -> None:
        def write(tmp: str) -> None:
            with open(tmp, "w", newline="") as file:
                writer = csv.DictWriter(file, fieldnames=self._keys)
                writer.writeheader()
                writer.writerows(rows)
        write_atomic(Path(self.metrics_file_path), write)


def scalar(value):
    """A metric as a number: a tensor's value (the log is written between steps, off the hot
    path), anything else as given."""
    return value.item() if hasattr(value, "item") else value


def row_step(row: dict) -> float:
    """The step of a metrics.csv row; a row without one (a line cut short) is never kept."""
    try:
        return float(row.get("step"))
    except (TypeError, ValueError):
        return math.inf
