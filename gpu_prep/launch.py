"""The console script: the fast engine's head start (gpu_prep/tokenization/early.py) first, then the CLI, whose imports
take the first 0.2 s of a run."""

from __future__ import annotations

import os
import sys

from gpu_prep.tokenization import early


def main() -> None:
    # numpy's OpenBLAS starts a thread per core that spins for a while as numpy is imported (70 ms of a core,
    # measured with perf, while the other core builds the engine); gpu-prep multiplies no matrices.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    early.start(sys.argv)
    from gpu_prep.cli import main as cli_main

    cli_main()


if __name__ == "__main__":  # python -m gpu_prep.launch
    main()
