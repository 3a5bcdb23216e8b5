"""speechpipe: composable, functional datapipes for speech training data.

Importing speechpipe registers every functional name (``parse_scp``, ``open``, ...) on
torch's ``IterDataPipe``/``MapDataPipe``.
"""

__version__ = "0.1.0"

from .pipes import sources  # noqa: E402,F401  (registers list_shards, open)
from .pipes import order  # noqa: E402,F401  (registers join_by_key)
