"""python -m bench <command> [key=value ...]: parse, dispatch, and turn every failure into one
line and an exit code (2: a configuration error; a run that started: its `failed` record and
non-zero). The commands live in run_commands (train or measure) and report_commands (read
records); bench/cli/usage.py holds what --help prints."""
from __future__ import annotations

import os
import sys

# (Ctrl-C while these import is answered by bench/__main__.py, which imports this module)
from bench.cli import report_commands, run_commands
from bench.cli.openmp import set_thread_wait
from bench.cli.options import fail
from bench.cli.usage import HELP, USAGE
from bench.config import ConfigError, first_line
from bench.config.commands import COMMANDS
from bench.records.store import RunFailed, SignalAfterRecord

HANDLERS = {"run": run_commands.cmd_run, "references": run_commands.cmd_references,
            "eval": run_commands.cmd_eval, "speed": run_commands.cmd_speed,
            "gpucheck": run_commands.cmd_gpucheck, "suite": run_commands.cmd_suite,
            "sweep": run_commands.cmd_sweep, "list": run_commands.cmd_list,
            "leaderboard": report_commands.cmd_leaderboard, "claims": report_commands.cmd_claims,
            "compare": report_commands.cmd_compare, "plot": report_commands.cmd_plot,
            "identities": report_commands.cmd_identities, "export": report_commands.cmd_export}


def main(argv: list[str] | None = None) -> int:
    set_thread_wait()  # before torch loads: how its threads wait between ops (bench/cli/openmp.py)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(HELP.strip())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        return fail(f"unknown command '{command}'; choose one of: {', '.join(COMMANDS)}")
    if any(arg in ("-h", "--help", "help") for arg in rest):
        print(USAGE[command])
        return 0
    flag = next((arg for arg in rest if arg.startswith("-")), None)
    if flag is not None:
        return fail(f"unknown option '{flag}'; arguments are key=value (python -m bench "
                    f"{command} --help)")
    try:
        code = HANDLERS[command](rest)
        if code and command in ("suite", "sweep"):
            from bench.training.signals import wait_for_rank_zero
            wait_for_rank_zero()  # a DDP rank leaves after rank 0, so rank 0's exit is its own
        return code
    except ConfigError as error:
        return fail(str(error))
    except RunFailed as error:  # the run started: its `failed` record says the rest
        where = f" (record: {error.path})" if error.path else ""
        print(f"error: run failed: {error.reason}{where}", file=sys.stderr)
        from bench.training.signals import wait_for_rank_zero
        wait_for_rank_zero()  # a DDP rank leaves after rank 0, so rank 0's exit is its own
        return error.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except SignalAfterRecord as error:  # the run ended well; the signal stops the rest
        print(f"error: {error}", file=sys.stderr)
        return 128 + error.signum
    except BrokenPipeError:  # `python -m bench list | head`: the reader left, nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as error:  # a bug, not a user error: one line unless asked for the trace
        if os.environ.get("BENCH_DEBUG"):
            raise
        print(f"error: internal error: {type(error).__name__}: {first_line(error)} "
              "(BENCH_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1
