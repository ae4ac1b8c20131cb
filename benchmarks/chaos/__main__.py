"""`python -m benchmarks.chaos`: see the package's docstring and `--help`."""

import sys

from minions.text.datasets import exit_on_missing_set

from .run import main

sys.exit(exit_on_missing_set(main))
