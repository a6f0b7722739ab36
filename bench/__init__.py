"""The runner, by concern; each folder imports only the ones above it in this list:

    config/    torch-free: compose a run's config from conf/ and key=value overrides
    records/   the run record: its schema, writing and reading it, the code that made it
    training/  one run: build, train (Lightning), evaluate against the references, write
    reports/   what reads records: identities, leaderboard, claims, compare, plots
    perf/      speed benchmarks and the GPU checks
    cli/       the command line (python -m bench) and the suite runner

Importing it changes nothing (how the CLI's OpenMP threads wait is set in bench.cli.main.main,
bench/cli/openmp.py)."""
