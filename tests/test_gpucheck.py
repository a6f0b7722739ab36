"""python -m bench gpucheck drives its sections within a budget, each in a process group killed
whole at its cap, every figure a row written the moment it is measured: a section killed mid-way
keeps its rows and leaves no process behind. On a machine without a GPU the CUDA-only sections
say so and the others run (the CPU rehearsal, docs/gpu.md)."""
import importlib.util
import json
import os
import sys
import time

import pytest

from bench.perf.gpucheck import ddp, driver, kernel, plan, processes, throughput
from bench.perf.gpucheck import runs as run_sections
from bench.perf.gpucheck import rows as rows_module
from bench.perf.gpucheck.rows import read_rows
from bench.cli.main import main


GPUCHECK_MODULES = (ddp, driver, kernel, plan, processes, run_sections, throughput)


def patch_all(monkeypatch, name: str, value) -> None:
    """name replaced in every gpucheck module that imported it (each looks it up in its own)."""
    for module in GPUCHECK_MODULES:
        if hasattr(module, name):
            monkeypatch.setattr(module, name, value)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie waiting for its reaper is gone
        return stat.read().split(")")[-1].split()[0] != "Z"


def gone_within(pid: int, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


def test_the_environment_section_reports_and_the_others_say_why_not(tmp_path, capsys):
    # env alone within a budget it cannot run out of (10 s alone, over 20 s beside DDP tests)
    assert main(["gpucheck", "sections=env,warm,parity", "budget=120", f"out={tmp_path}"]) == 0
    result = json.loads((tmp_path / "gpucheck.json").read_text())
    env = result["sections"]["env"]["rows"][0]
    assert env["torch"] and env["provenance"]["torch"] == env["torch"]
    assert "kernel_import_error" in env and env["hub_offline"] == "1"
    assert result["sections"]["env"]["status"] == "ok"
    assert result["sections"]["warm"]["skipped"] == "needs CUDA"  # this machine has no GPU
    assert result["sections"]["parity"]["skipped"] == "needs CUDA"
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [r["section"] for r in rows] == ["env"]
    out = capsys.readouterr().out
    assert "== warm: skipped (needs CUDA)" in out and "rows (every figure" in out
    if all(importlib.util.find_spec(m) for m in ("mamba_ssm", "triton", "einops")):
        # The CUDA-less install of mamba-ssm imports, plainly, with the harness's stand-ins.
        assert env["kernel_import_error"] is None, (env["kernel_import_error"], result["stand_ins"])


HANGING_SECTION = """
import json, subprocess, sys, time
from bench.perf.gpucheck.rows import emit
args = json.loads(sys.argv[1])
emit(args, {"label": "measured before the hang", "ms_per_step": 1.5})
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
emit(args, {"label": "child", "pid": child.pid})
time.sleep(300)
"""

QUICK_SECTION = """
import json, sys
from bench.perf.gpucheck.rows import emit
emit(json.loads(sys.argv[1]), {"label": "the next section"})
"""


def test_a_section_killed_at_its_cap_keeps_its_rows_and_leaves_no_process(tmp_path, monkeypatch,
                                                                         capsys):
    """A planted section that measures a row, starts a child and hangs: at its cap the whole
    process group goes (the child too), its rows are in rows.jsonl and gpucheck.json, the
    driver goes on to the next section (a planted env: the real one is the test above's, and
    costs a process's imports)."""
    monkeypatch.setitem(plan.CAPS, "tiny", 6)
    monkeypatch.setitem(plan.NEEDS, "tiny", 1)
    planted = {"tiny": HANGING_SECTION, "env": QUICK_SECTION}
    patch_all(monkeypatch, "section_command", lambda name, args: (
        [sys.executable, "-c", planted[name], json.dumps(args)]))
    start = time.monotonic()
    assert main(["gpucheck", "sections=tiny,env", "budget=60", f"out={tmp_path}"]) == 0
    assert time.monotonic() - start < 40
    result = json.loads((tmp_path / "gpucheck.json").read_text())
    tiny = result["sections"]["tiny"]
    assert tiny["status"].startswith("killed at its cap")
    assert [r["label"] for r in tiny["rows"]] == ["measured before the hang", "child"]
    assert tiny["rows"][0]["ms_per_step"] == 1.5
    assert gone_within(tiny["rows"][1]["pid"], 5), "the section's child outlived its cap"
    assert result["sections"]["env"]["status"] == "ok"  # the next section ran
    assert [r["label"] for r in result["sections"]["env"]["rows"]] == ["the next section"]
    assert "measured before the hang" in capsys.readouterr().out  # in the final table


def test_a_finished_sections_orphans_are_killed_too():
    script = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
              "'import time; time.sleep(300)']); print(p.pid)")
    done = processes.run_group([sys.executable, "-c", script], timeout=30)
    assert done["exit"] == 0
    assert gone_within(int(done["stdout"].strip()), 5)


@pytest.mark.parametrize("option, message", [
    ("budget=0", "budget must be a positive number of seconds, got '0'"),
    ("budget=-1", "budget must be a positive number of seconds, got '-1'"),
    ("budget=abc", "budget must be a positive number of seconds, got 'abc'"),
    ("budget=nan", "budget must be a positive number of seconds, got 'nan'"),
    ("steps=0", "steps must be an integer in [1, 10000], got '0'"),
    ("steps=x", "steps must be an integer in [1, 10000], got 'x'"),
    ("sections=env,warp", "unknown section(s) warp"),
    ("colour=blue", "unknown or empty option 'colour=blue'"),
    ("budget=", "unknown or empty option 'budget='"),
    ("tokenizer_file=/nonexistent/tokenizer.json", "is not a file"),
])
def test_bad_options_are_one_line_errors(option, message, tmp_path, capsys):
    assert main(["gpucheck", option, f"out={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "out" / "gpucheck.json").exists()


def test_an_out_folder_that_cannot_be_written_is_refused_before_anything_runs(tmp_path, capsys):
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert main(["gpucheck", "sections=env", f"out={blocked / 'sub'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: out={blocked / 'sub'} cannot be written") and \
        err.count("\n") == 1


def test_out_defaults_to_the_device_calls_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert plan.parse_options([])["out"] == str(tmp_path)
    monkeypatch.delenv("OUT")
    assert plan.parse_options([])["out"] == os.path.join("runs", "gpucheck")


def test_sigterm_to_the_driver_kills_the_running_section_and_keeps_the_figures(
        tmp_path, monkeypatch, capsys):
    """The device call's end (or Ctrl-C) while a section runs: its group is killed, the rows so
    far are saved in gpucheck.json, and the driver exits 143."""
    import signal
    import threading

    monkeypatch.setitem(plan.NEEDS, "tiny", 1)
    patch_all(monkeypatch, "section_command", lambda name, args: (
        [sys.executable, "-c", HANGING_SECTION, json.dumps(args)]))
    rows = tmp_path / "rows.jsonl"

    def terminate_once_the_child_is_up():
        end = time.monotonic() + 30
        while time.monotonic() < end and rows.read_text().count("\n") < 2 \
                if rows.exists() else time.monotonic() < end:
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate_once_the_child_is_up, daemon=True).start()
    assert main(["gpucheck", "sections=tiny", "budget=60", f"out={tmp_path}"]) == 143
    result = json.loads((tmp_path / "gpucheck.json").read_text())
    assert result["stopped"] == "by SIGTERM"
    assert result["sections"]["tiny"]["status"] == "stopped by SIGTERM"
    assert [r["label"] for r in result["sections"]["tiny"]["rows"]] == [
        "measured before the hang", "child"]
    child = [json.loads(line) for line in rows.read_text().splitlines()][1]
    assert gone_within(child["pid"], 5)
    assert "stopped by SIGTERM" in capsys.readouterr().err


def test_every_command_line_a_section_builds_composes(tmp_path, monkeypatch):
    """The `bench run` lines of tiny, paper, ddp and text, on the CUDA branch and on the CPU one,
    and the configs speed and lm build, are valid: composed as `bench run` composes them. (The
    first GPU call lost its NCCL row to a key the ddp section gave twice, on a branch only CUDA
    reaches.) The processes are stand-ins: nothing runs."""
    from bench.config import compose

    started = []

    class Process:
        pid = None

        def poll(self):
            return 0

        def send_signal(self, signum):
            pass

    def start(argv, env=None, cwd=processes.REPO):
        started.append(argv)
        return Process()

    patch_all(monkeypatch, "start_group", start)
    patch_all(monkeypatch, "finish_group", lambda process, timeout: {
        "exit": 0, "wait_s": 0.0, "stdout": "", "stderr": ""})
    patch_all(monkeypatch, "wait_for_training", lambda process, timeout: True)
    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    for cuda in (True, False):
        args = {"section": "check", "rows": str(tmp_path / "rows.jsonl"),
                "runs": str(tmp_path / "runs"), "scratch": str(tmp_path), "cuda": cuda,
                "deadline": time.monotonic() + 600, "steps": 20, "tokenizer_file": ""}
        for section in (run_sections.section_tiny, run_sections.section_paper, ddp.section_ddp,
                        run_sections.section_text):
            section(args)
    runs = [argv[4:] for argv in started if argv[1:4] == ["-m", "bench", "run"]]
    # tiny, paper, 2 ranks, 2 ranks signalled, 1 process signalled, text; NCCL on CUDA alone
    assert len(runs) == 2 * 8 + 1
    assert sum("trainer.process_group_backend=nccl" in argv for argv in runs) == 1
    for argv in runs:
        compose(argv)  # a ConfigError names what is wrong
    args["tokenizer_file"] = ""
    for argv in [*throughput.SPEED_CONFIGS.values(),
                 *(throughput.lm_argv(args, model) for model in throughput.LM_MODELS)]:
        compose([*argv, "trainer.accelerator=gpu"])


def test_speed_times_what_needs_no_autotune_first():
    """The pure-PyTorch scan's rows, compile off and then on, before any kernel row (call 1's
    compile rows came after the kernel's and were never reached)."""
    plan = throughput.speed_plan(cuda=True, kernel=True, tuned={"mamba_4x256_T1024"})
    kernels = [(kernel, compiled) for _, kernel, _, compiled in plan]
    assert kernels == sorted(kernels, key=lambda k: (k[0] == "mamba_ssm", k[1]))
    assert kernels.index(("torch", True)) < kernels.index(("mamba_ssm", False))
    first_kernel_row = next(row for row in plan if row[1] == "mamba_ssm")
    assert first_kernel_row[0] == "mamba_4x256_T1024"  # the tuned shape before the other
    assert throughput.speed_plan(cuda=False, kernel=False, tuned=set()) == [
        ("markov_paper", "torch", "32-true", False), ("markov_paper", "torch", "bf16-mixed", False)]


def test_the_language_models_use_the_kernel_only_where_it_was_tuned():
    plan = throughput.lm_plan({"mamba_lm14m"})
    # the 14.5M presets' compile rows early: the tokens/s goal is theirs
    assert [(model, compiled) for model, compiled, _ in plan][:2] == [("mamba_lm14m", False),
                                                                    ("mamba_lm14m", True)]
    assert [compiled for _, compiled, _ in plan] == [False, True, False, True, False, False]
    assert {(model, kernel) for model, _, kernel in plan} == {
        ("mamba_lm14m", "mamba_ssm"), ("transformer_lm14m", None), ("mamba_lm110m", "torch"),
        ("mamba_lm200m", "torch")}
    assert {kernel for _, _, kernel in throughput.lm_plan(set())} == {"torch", None}


def test_warm_counts_what_compiled_what_the_gpu_cannot_hold_and_what_the_budget_cut(
        tmp_path, monkeypatch):
    """The H100 call: one config per shape over the GPU's shared memory (the autotuner skips it
    too, so not a failure), and jobs still running or never started when the budget ran out."""
    patch_all(monkeypatch, "warm_shapes", lambda: {"small": (2, 8, 1, 4, 1, 2, 4)})
    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    deadline = time.monotonic() + 600

    class Process:
        def __init__(self, index):
            self.index = index

        def poll(self):
            return None if self.index == 9 else 0  # job 9 never ends

    def start(argv, env=None, cwd=processes.REPO):
        return Process(json.loads(argv[-1])["index"] if "warm_one" in argv else -1)

    def finish(process, timeout):
        if process.index == 3:
            return {"exit": 1, "stdout": "", "stderr": "OutOfResources: out of resource: "
                                                       "shared memory, Required: 263168"}
        return {"exit": 0, "stdout": json.dumps({"seconds": 2.0}), "stderr": ""}

    def run(argv, timeout, env=None):
        return {"exit": 0, "stdout": "", "stderr": "", "wall_s": 0.0}

    patch_all(monkeypatch, "start_group", start)
    patch_all(monkeypatch, "finish_group", finish)
    patch_all(monkeypatch, "run_group", run)
    clock = iter(range(10**6))  # the budget ends after a few polls of job 9
    patch_all(monkeypatch, "seconds_left", lambda args: 1000 if next(clock) < 40 else 20)
    args = {"section": "warm", "rows": str(tmp_path / "rows.jsonl"), "deadline": deadline}
    kernel.section_warm(args)
    rows = {row["label"]: row for row in read_rows(tmp_path / "rows.jsonl")}
    compiled = rows["compile small"]
    assert compiled["jobs"] == 17 and compiled["over_shared_memory"] == 1
    assert compiled["compiled"] + compiled["not_compiled"] == 16 and compiled["not_compiled"] >= 1
    assert "killed: budget" in compiled["errors"]


def test_the_language_models_are_built_with_the_planned_kernel(tmp_path, monkeypatch):
    """lm builds each preset with the kernel its plan names, never kernel=auto, which on CUDA
    meets the kernel's smoke test: a cold autotune of the preset's shape (call 1: minutes, past
    lm's cap). (Composed without the checks, which refuse trainer=lm's GPU here.)"""
    from bench.config import compose
    monkeypatch.setattr(throughput, "compose_checked", compose)
    args = {"scratch": str(tmp_path), "tokenizer_file": ""}
    for model, compiled, planned in throughput.lm_plan(set()):
        setting = {"kernel": planned, "precision": "bf16-mixed", "compile": compiled}
        config = throughput.lm_config(args, model, setting)
        assert getattr(config.model, "kernel", None) == planned  # None: a transformer
        assert config.trainer.precision == "bf16-mixed" and config.trainer.compile is compiled


def test_nccl_runs_first_in_ddp_with_a_time_of_its_own(tmp_path, monkeypatch):
    """The NCCL run is ddp's first, with plan.NCCL_S (call 1 gave it 0.3 of what was left, ~25 s,
    and a run there takes ~27 s), whatever the section has left beyond it."""
    calls = []
    monkeypatch.setattr(ddp, "run_row", lambda args, label, argv, timeout: calls.append(
        (label, timeout)) or {})
    monkeypatch.setattr(ddp, "two_ranks", lambda args, argv: calls.append(("2 ranks", None))
                        or [None, None])
    monkeypatch.setattr(ddp, "finish_group", lambda process, timeout: {"exit": 0, "stderr": ""})
    monkeypatch.setattr(ddp, "signal_row", lambda args, label, *rest: calls.append((label, None)))
    monkeypatch.setattr(ddp, "start_group", lambda argv, env=None: None)
    args = {"rows": str(tmp_path / "rows.jsonl"), "runs": str(tmp_path / "runs"), "cuda": True,
            "section": "ddp", "deadline": time.monotonic() + 500}
    ddp.section_ddp(args)
    assert calls[0][0] == "ddp, nccl, devices=1"
    assert calls[0][1] == pytest.approx(plan.NCCL_S)
    assert [label for label, _ in calls[1:]] == ["2 ranks", "2 ranks", "SIGTERM to rank 1 of 2",
                                                 "SIGTERM to a one-process run"]


def rehearse(tmp_path, monkeypatch, budget: float, seconds: dict) -> dict:
    """The driver's schedule on a fake clock: each section takes `seconds[name]` (its cap where
    absent: the worst case) or its cap if that is less, as run_group's kill makes it. Returns
    {section: (start, seconds taken) or the reason it was skipped}."""
    now = [0.0]
    schedule = {}

    def run_group(command, cap, env):
        name = json.loads(command[-1])["section"]
        taken = min(seconds.get(name, cap), cap)
        schedule[name] = (now[0], taken)
        now[0] += taken
        return {"exit": 0 if taken < cap else "timeout", "wall_s": taken, "stdout": "",
                "stderr": ""}

    monkeypatch.setattr(driver, "run_group", run_group)
    options = plan.parse_options([f"budget={budget}", f"out={tmp_path}"])
    results = {"sections": {}}

    def save():  # the driver's save() gathers rows; there are none here
        for section in results["sections"].values():
            section.setdefault("rows", [])

    driver.run_sections(options, True, budget, tmp_path, {}, results, save, tmp_path,
                        clock=lambda: now[0])
    for name, section in results["sections"].items():
        if "skipped" in section:
            schedule[name] = section["skipped"]
    return schedule


def test_a_section_is_skipped_with_less_of_the_budget_left_than_it_needs(tmp_path, monkeypatch):
    schedule = rehearse(tmp_path, monkeypatch, 34, {"env": 10})
    assert schedule["env"] == (0, 10)
    assert schedule["speed"] == "24 s of the budget left, needs ~40 s"
    assert schedule["tiny"] == "24 s of the budget left, needs ~25 s"


def test_the_default_plan_reaches_speed_lm_and_nccl_first(tmp_path, monkeypatch):
    """README's call (budget 450) rehearsed with call 1's section times and speed and lm at
    their caps: speed starts at 18 s and lm at 138 s, both inside the first 300 s, ddp (NCCL
    first) at 258 s, and the paper run still fits (383-427 s); warm and parity, which call 1
    measured, wait for a larger budget (600: 427-547 s and 547-600 s). A section never runs past
    its cap, so none takes more of a later one's time than that: with every section at its cap,
    speed still starts at 40 s and lm at 160 s."""
    schedule = rehearse(tmp_path, monkeypatch, 450, plan.CALL1_SECTION_S)
    assert list(plan.SECTIONS[:4]) == ["env", "speed", "lm", "ddp"]
    assert schedule["speed"][0] == 18 and schedule["lm"][0] == 138
    assert schedule["speed"][0] + schedule["speed"][1] <= 300
    assert schedule["lm"][0] < 300 and schedule["ddp"][0] < 300
    assert schedule["paper"][0] <= 450 - plan.NEEDS["paper"]
    assert all(isinstance(schedule[s], str) for s in ("warm", "parity"))
    worst = rehearse(tmp_path, monkeypatch, 450, {})  # every section to its cap
    assert worst["speed"][0] == plan.CAPS["env"] and worst["lm"][0] == 160
    for name, entry in worst.items():
        assert isinstance(entry, str) or entry[1] <= plan.CAPS[name]


def test_the_start_up_breakdown_accounts_for_a_run_process():
    """A run_row of one record (its process wall beside the record's own clock) split into the
    record's start-up parts, the rest of training, each part of evaluation, and what follows the
    record; the parts add up to the process's wall time."""
    row = {"wall_s": 40.0, "run_wall_s": 25.0, "train_s": 20.0,
           "startup_s": {"before_run": 9.0, "to_fit": 1.0, "to_train": 2.0, "first_batch": 3.0},
           "eval_s": {"held_out": 1.0, "model": 2.0, "references": 1.5, "scoring": 0.5}}
    breakdown = rows_module.startup_breakdown(row)
    parts = breakdown["parts_s"]
    assert breakdown["process_wall_s"] == 40.0
    assert parts["training_after_first_batch"] == 14.0 and parts["after_record"] == 6.0
    assert parts["eval_model"] == 2.0
    assert sum(parts.values()) == pytest.approx(40.0)  # the record's wall: training + evaluation
    assert rows_module.startup_breakdown({"wall_s": 3.0, "run_wall_s": 1.0}) is None
