"""The console script: the fast engine's head start (gpu_prep/early.py) first, then the CLI, whose imports
take the first 0.2 s of a run."""

from __future__ import annotations

import sys

from gpu_prep import early


def main() -> None:
    early.start(sys.argv)
    from gpu_prep.cli import main as cli_main

    cli_main()
