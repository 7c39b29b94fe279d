"""``python -m simplace``: the ``simplace`` command line."""

import sys

from simplace.cli import console_main

sys.exit(console_main())
