"""The commands of `python -m bench`: a registry below the CLI, so that what checks a command
line (the claims' reproducing commands) need not import the CLI itself."""

COMMANDS = ("run", "references", "leaderboard", "claims", "speed", "suite", "sweep", "list",
            "gpucheck", "plot", "eval", "compare", "identities", "export")
