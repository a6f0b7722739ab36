"""The command line (python -m bench) and the suite runner."""
