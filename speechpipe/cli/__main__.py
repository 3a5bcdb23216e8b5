"""``python -m speechpipe.cli``: the ``speechpipe`` command."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
