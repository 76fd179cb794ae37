"""``python -m fda_core`` — same as the ``fda`` command (see :mod:`fda_core.workbook.cli`)."""

import sys

from .workbook.cli import main

if __name__ == "__main__":
    sys.exit(main())
