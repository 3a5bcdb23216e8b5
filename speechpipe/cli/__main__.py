"""``python -m speechpipe.cli``: the ``speechpipe`` command."""

import sys

from . import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
