"""One worker of `suite launcher=local workers=N` (bench/cli/launch.py): `python -m
bench.cli.worker <launch folder> <slot> <workers>` runs the folder's plan, settling entries into
results-<slot>.jsonl there. Its exit status: 0, or 128 + the signal that stopped its run."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.cli.openmp import set_thread_wait


def main(argv: list[str]) -> int:
    folder, slot, workers = Path(argv[0]), int(argv[1]), int(argv[2])
    set_thread_wait()  # as the command line's own process, before torch loads
    from bench.cli.launch import Plan, pin_cores, work
    pin_cores()
    plan = Plan(**json.loads((folder / "plan.json").read_text()))
    return work(plan, slot, folder, workers)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
