"""How torch's CPU threads wait between ops, chosen by the command line before torch loads.

A training step of these small models is thousands of small ops, and torch's OpenMP threads meet
at a barrier after each. How a thread waits there decides the step's speed:
- libgomp's default spins for 300,000 turns. Alone that is fast, but beside another process the
  spinning threads take the cores from it, and a run is 5× slower (docs/measured-2026-11.md,
  "Threads").
- Sleeping at once (`OMP_WAIT_POLICY=PASSIVE`, the choice until 2026-11-28) pays a wake-up at
  every barrier. Alone, two such threads were no faster than one.
- A short spin (`GOMP_SPINCOUNT=1000`, the choice now) keeps most of the speed of spinning alone
  and costs a quarter of it beside a second run. Default step in a 400-step fit, mean ms, four
  alternated rounds alone and two pairs side by side (docs/profile-cpu-step.md, "How idle threads
  wait"):

  | wait | alone | beside a second run |
  |---|---|---|
  | PASSIVE | 36.3–47.5 | 42.2–44.4 |
  | spin 1000 | 27.8–30.7 | 52.4–53.6 |
  | spin 3000 | 25.6–28.0 | 74.1 |

The OpenMP runtime reads these once, when torch loads it, so the command line sets them first
thing in main, never at import. A value the user set wins: `OMP_WAIT_POLICY=PASSIVE` for machines
shared with other work, `ACTIVE` for a dedicated one. The LLVM and Intel runtimes (torch on macOS,
some conda builds) ignore GOMP_SPINCOUNT and spin for 200 ms by default; for them KMP_BLOCKTIME=0
keeps the sleeping behaviour they had under PASSIVE."""
from __future__ import annotations

import os

from bench.records.store import THREAD_WAIT_KEYS

SPIN_COUNT = "1000"


def set_thread_wait() -> None:
    """Sets the short spin unless the environment already says how threads wait (a run's record
    keeps what it was: train.thread_wait)."""
    if any(key in os.environ for key in THREAD_WAIT_KEYS):
        return
    os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    os.environ["KMP_BLOCKTIME"] = "0"
