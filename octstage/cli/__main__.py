"""``python -m octstage.cli``: the ``octstage`` command."""

import sys

from octstage.cli import main

sys.exit(main())
