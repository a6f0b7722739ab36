"""The runner: configuration, training, evaluation, run records, leaderboard, speed benchmark."""
import os

# Idle OpenMP threads sleep instead of spinning. Torch's CPU threads spin-wait between the many
# small ops of these models; when another process shares the cores, spinning threads steal
# each other's time and a run is ~5x slower (README "Threads"). Read when torch loads, so it
# is set here, before any torch import; a value in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
