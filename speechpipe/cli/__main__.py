"""``python -m speechpipe.cli``: the ``speechpipe`` command."""

import sys

from . import main

sys.exit(main())
