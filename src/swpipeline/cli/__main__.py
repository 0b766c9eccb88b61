"""``python -m swpipeline.cli``: the same as the ``swpipeline`` command."""

import sys

from . import main

sys.exit(main(sys.argv[1:]))
