"""``python -m kgpipe.cli``: the same as the ``kgpipe`` command."""

import sys

from kgpipe.cli.main import main

sys.exit(main())
