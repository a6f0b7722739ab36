"""The runner: configuration, training, evaluation, run records, leaderboard, speed benchmark.
Importing it changes nothing (the CLI's OMP_WAIT_POLICY is set in bench.__main__.main)."""
