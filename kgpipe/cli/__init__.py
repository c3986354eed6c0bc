"""The ``kgpipe`` command line: one module per subcommand (:mod:`.train`, :mod:`.evaluate`,
:mod:`.export`, :mod:`.predict`, :mod:`.ls`), assembled by :mod:`.main`.

User errors (bad config, bad data, missing run folders) print one clear message and exit with
status 2; nothing is half-written. Unexpected errors keep their traceback (they are bugs).
"""

from kgpipe.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
