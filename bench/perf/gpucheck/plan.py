"""The plan of a GPU check: its sections, what each needs and may take of the budget, its options
(checked before anything runs) and the command line of a section's process."""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

from bench.config import ConfigError, check_path, entry_numbers, load_suite, shown

# The default order: what no call has measured yet first (speed, lm, NCCL in ddp), then what
# call 1 measured (tiny and paper, warm, parity). With budget 450 and call 1's section times,
# speed starts at 18 s and lm at 138 s; warm and parity need a larger budget
# (tests/test_gpucheck.py rehearses the schedule).
SECTIONS = ("env", "speed", "lm", "ddp", "tiny", "paper", "warm", "parity", "text", "suite")


CUDA_ONLY = ("warm", "parity", "lm", "suite")


# Seconds of section ddp's NCCL run, first in the section: a `bench run` of its config took
# ~27 s on call 1's H100 (it had 0.3 of what was left, ~25 s, and was cut)
NCCL_S = 45


# Seconds a section needs at least (it is skipped with less of the budget left) and the most it
# may take. Seen on a cold H100 (2026-11-26, docs/gpu.md): env 18, tiny 28, paper 44,
# ddp 77 (NCCL cut at ~25 s of it; now 45 s of its own), warm cut at its old cap of 120 s with
# 35 of 51 compile jobs done (so its autotune and the kernel's speed rows found nothing tuned),
# parity 67. speed and lm have no measured time yet (call 1's speed met a cold autotune at its
# second row and was cut at 100 s; lm was not reached): each may take 120 s, compiling included.
CALL1_SECTION_S = {"env": 18, "tiny": 28, "paper": 44, "ddp": 77 - 25 + NCCL_S, "warm": 120,
                   "parity": 67}
NEEDS = {"env": 10, "tiny": 25, "paper": 60, "ddp": 45, "warm": 60, "parity": 30, "speed": 40,
         "lm": 40, "text": 40, "suite": 60}


CAPS = {"env": 40, "tiny": 60, "paper": 110, "ddp": 130, "warm": 240, "parity": 90,
        "speed": 120, "lm": 120, "text": 70, "suite": 100000}


# warm stops compiling with this much of its cap left, for the autotune pass: it benchmarks each
# compiled config of three shapes, forward and backward (on the H100 a 40 s pass ended in none,
# with 16 of 51 configs still to compile)
TUNE_RESERVE_S = 90


MARKOV_PAPER = ["trainer=paper", "task.seq_len=256"]  # paper 000 Table 7: batch 64, lr 1e-3


MAMBA_4x256 = ["trainer=paper", "model.n_layers=4", "model.d_model=256", "model.headdim=64",
               "task.seq_len=1024"]


PAPER_STEPS = 10000


BPE_VOCAB = 50257  # GPT-2's vocabulary size: the language models' embedding as in the paper


OPTIONS = dict(sections=",".join(SECTIONS), budget="450", out="", steps="20",
               suite="paper000_gpu", suite_entries="1-3", tokenizer_file="")


def parse_options(argv: list[str]) -> dict:
    """The options, validated: a wrong one is a ValueError (bench.config.ConfigError is one)
    whose text is the error line. Nothing here needs a GPU or torch: a bad option is refused
    before a section (or a borrowed device's time) is spent."""
    options = dict(OPTIONS, out=os.environ.get("OUT") or str(Path("runs") / "gpucheck"))
    given = set()
    for arg in argv:
        key, _, value = arg.partition("=")
        if key not in options or not value and key != "tokenizer_file":
            raise ValueError(f"unknown or empty option '{shown(arg)}'; options: "
                             f"{', '.join(OPTIONS)}")
        if key in given:  # the second would win silently
            raise ValueError(f"'{key}' is given twice; give each option once")
        given.add(key)
        options[key] = value
    sections = options["sections"].split(",")
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        named = ", ".join(s or "'' (an empty name)" for s in unknown)
        raise ValueError(f"unknown section(s) {shown(named)}; choose from "
                         f"{', '.join(SECTIONS)}")
    twice = next((s for i, s in enumerate(sections) if s in sections[:i]), None)
    if twice is not None:  # one name, one result: the second run of a section has no place
        raise ValueError(f"section {twice} is listed twice; list each section once")
    try:
        budget = float(options["budget"])
    except ValueError:
        budget = math.nan
    if not math.isfinite(budget) or budget <= 0:
        raise ValueError(f"budget must be a positive number of seconds, got "
                         f"'{shown(options['budget'])}'")
    least = min(sections, key=NEEDS.__getitem__)
    if budget < NEEDS[least]:  # every section would be skipped: exit 0 having done nothing
        raise ValueError(f"budget={options['budget']} s is less than any section chosen "
                         f"needs (the least: {least}, ~{NEEDS[least]} s)")
    steps = options["steps"]  # isdigit() alone takes '²', which int() then refuses
    if not (steps.isascii() and steps.isdigit()) or steps[0] == "0" or len(steps) > 5 \
            or int(steps) > 10000:
        raise ValueError(f"steps must be an integer in [1, 10000], got '{shown(steps)}'")
    try:
        size = len(load_suite(options["suite"]))
        entry_numbers(options["suite_entries"], size)
    except ConfigError as error:
        raise ValueError(f"suite={shown(options['suite'])} "
                         f"suite_entries={shown(options['suite_entries'])}: {error}") from None
    check_path("out", options["out"], folder=True)
    if options["tokenizer_file"]:
        check_path("tokenizer_file", options["tokenizer_file"])
        if not Path(options["tokenizer_file"]).is_file():
            raise ValueError(f"tokenizer_file {options['tokenizer_file']} is not a file")
    return {**options, "sections": sections, "budget": budget, "steps": int(steps)}


def section_command(name: str, args: dict) -> list[str]:
    """The process of one section."""
    return [sys.executable, "-m", "bench.perf.gpucheck", name, json.dumps(args)]
