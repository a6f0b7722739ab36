"""`python -m bench`: the command line (bench/cli/main.py)."""
import sys

if __name__ == "__main__":
    try:  # Ctrl-C while Python is still importing: the same one line as later, no traceback
        from bench.cli.main import main
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    sys.exit(main())
