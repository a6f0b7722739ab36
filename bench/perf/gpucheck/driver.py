"""The driver of `python -m bench gpucheck`: the options, the call's environment (Triton's cache, no
hub), each section in turn within the budget, the figures saved after every section."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from bench.perf.gpucheck.plan import CAPS, CUDA_ONLY, NEEDS, parse_options, section_command
from bench.perf.gpucheck.processes import Stopped, _stop, run_group
from bench.perf.gpucheck.rows import brief, read_rows


def _writable_folder(path: Path) -> None:
    """Create `path` if needed and check a file can be written there (before anything runs)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".gpucheck-probe-"):
            pass
    except OSError as error:
        raise ValueError(f"out={path} cannot be written: {error.strerror or error}") from None


def _environment(scratch: Path) -> dict:
    from bench.perf.kernel_parity import stand_in_env
    env = stand_in_env(os.environ)  # for mamba-ssm's CUDA-less install (see the docstring)
    env.setdefault("TRITON_CACHE_DIR", str(scratch / "triton"))
    env.update(TRITON_CACHE_AUTOTUNING="1", TRITON_F32_DEFAULT="ieee", HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    return env


def main(argv: list[str]) -> int:
    try:
        options = parse_options(argv)
        out = Path(options["out"])
        _writable_folder(out)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    import torch  # whether the CUDA-only sections can run
    cuda = torch.cuda.is_available()
    budget_end = time.monotonic() + options["budget"]
    scratch = Path(tempfile.mkdtemp(prefix="gpucheck-"))
    runs = scratch / "runs"
    env = _environment(scratch)
    rows_path, log_path = out / "rows.jsonl", out / "log.txt"
    for path in (rows_path, log_path):
        path.write_text("")
    from bench.perf.kernel_parity import missing_stand_ins
    from tasks.files import write_atomic
    results: dict = {"options": {**options, "sections": ",".join(options["sections"])},
                     "cuda": cuda, "stand_ins": missing_stand_ins(),
                     "triton_cache": env["TRITON_CACHE_DIR"], "sections": {}}

    def save() -> None:
        rows = read_rows(rows_path)
        for name, section in results["sections"].items():
            section["rows"] = [r for r in rows if r["section"] == name]
        write_atomic(out / "gpucheck.json",
                     lambda tmp: Path(tmp).write_text(json.dumps(results, indent=1, default=str)))

    print(f"gpucheck: {len(options['sections'])} sections, budget {options['budget']:.0f} s, "
          f"{'CUDA' if cuda else 'no CUDA: a CPU rehearsal'}; figures in {out}", flush=True)
    handlers = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        run_sections(options, cuda, budget_end, scratch, env, results, save, out)
    except Stopped as stop:
        results["stopped"] = f"by {stop}"
        for section in results["sections"].values():
            if section.get("status") == "running":
                section["status"] = f"stopped by {stop}"
        save()
        print(f"gpucheck: stopped by {stop}; what was measured is in {out}", file=sys.stderr)
        return 128 + stop.signum
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    if runs.is_dir():
        with tarfile.open(out / "records.tar.gz", "w:gz") as tar:
            tar.add(runs, arcname="runs", filter=lambda info: None if any(
                part in ("weights", "checkpoints", "cache") for part in Path(info.name).parts)
                else info)
    save()
    print("\nrows (every figure: rows.jsonl; by section: gpucheck.json)")
    for row in read_rows(rows_path):
        print("  " + brief(row))
    return 0


def run_sections(options: dict, cuda: bool, budget_end: float, scratch: Path, env: dict,
                 results: dict, save, out: Path, clock=time.monotonic) -> None:
    """Each section in turn, within the budget (see the module's docstring); `clock`: a
    rehearsal's stand-in for time.monotonic (tests/test_gpucheck.py)."""
    runs, rows_path, log_path = scratch / "runs", out / "rows.jsonl", out / "log.txt"
    for name in options["sections"]:
        left = budget_end - clock()
        if name in CUDA_ONLY and not cuda:
            results["sections"][name] = {"skipped": "needs CUDA"}
        elif left < NEEDS[name]:
            results["sections"][name] = {"skipped": f"{left:.0f} s of the budget left, needs "
                                                    f"~{NEEDS[name]} s"}
        if name in results["sections"]:
            print(f"== {name}: skipped ({results['sections'][name]['skipped']})", flush=True)
            save()
            continue
        cap = min(left, CAPS[name])
        args = {"section": name, "rows": str(rows_path.resolve()), "runs": str(runs),
                "scratch": str(scratch), "cuda": cuda, "deadline": clock() + cap - 3,
                "steps": options["steps"], "suite": options["suite"],
                "suite_entries": options["suite_entries"],
                "tokenizer_file": options["tokenizer_file"]}
        results["sections"][name] = {"status": "running"}  # what a stop mid-way says
        done = run_group(section_command(name, args), cap, env)
        summary = {}
        if done["exit"] == 0 and done["stdout"].strip():
            with contextlib.suppress(json.JSONDecodeError):
                summary = json.loads(done["stdout"].splitlines()[-1])
        status = ("ok" if done["exit"] == 0 else f"killed at its cap of {cap:.0f} s"
                  if done["exit"] == "timeout" else f"failed (exit {done['exit']})")
        section = {"status": status, "section_s": done["wall_s"], "summary": summary}
        if done["exit"] != 0:
            section["stderr"] = done["stderr"][-3000:]
        results["sections"][name] = section
        with open(log_path, "a") as log:
            log.write(f"===== {name}: {status} in {done['wall_s']:.0f} s\n--- stdout\n"
                      f"{done['stdout'][-20000:]}\n--- stderr\n{done['stderr'][-20000:]}\n")
        save()
        rows = results["sections"][name]["rows"]
        print(f"== {name}: {status} in {done['wall_s']:.0f} s, {len(rows)} rows", flush=True)
        if done["exit"] != 0:
            print("   " + done["stderr"].strip().splitlines()[-1][:300]
                  if done["stderr"].strip() else "   (no output)", flush=True)
