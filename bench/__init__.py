"""The runner: configuration, training, evaluation, run records, leaderboard, speed benchmark."""
