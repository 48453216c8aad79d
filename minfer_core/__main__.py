"""``python -m minfer_core``: the ``minfer`` command, for environments without its console script."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
