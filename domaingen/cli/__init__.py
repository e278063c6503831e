"""The `domaingen` command: argument parsing and printing only (main.py: train, list, download,
collect; sweep_commands.py: sweep and collect; inspect_commands.py: evaluate, diagnose, report)."""

from domaingen.cli.main import main

__all__ = ["main"]
