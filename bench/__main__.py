"""`python -m bench`, and the `icl-bench` console script: the command line (bench/cli/main.py)."""
import sys


def run() -> int:
    """The command line's exit code; Ctrl-C while Python is still importing gives the same one
    line as later, no traceback."""
    try:
        from bench.cli.main import main
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return main()


if __name__ == "__main__":
    sys.exit(run())
