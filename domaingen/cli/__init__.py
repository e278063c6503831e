"""The `domaingen` command: argument parsing and printing only (main.py: the parser, train, list
and download; sweep_commands.py: sweep, collect and export; inspect_commands.py: evaluate,
diagnose and report; spec_commands.py: spec, the shipped sweep specs; transfer_commands.py:
mask-transfer, Csordás et al.'s permuted-MNIST transfer experiment)."""

from domaingen.cli.main import main

__all__ = ["main"]
