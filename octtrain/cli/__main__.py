"""``python -m octtrain.cli``: the ``octtrain`` command (torchrun's entry too)."""

import sys

from octtrain.cli import main

sys.exit(main())
