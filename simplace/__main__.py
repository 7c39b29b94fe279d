"""``python -m simplace``: the ``simplace`` command line."""

import sys

from simplace.cli import main

sys.exit(main())
