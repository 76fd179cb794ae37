"""``python -m fda_core`` — same as the ``fda`` command (see :mod:`fda_core.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
