"""speechpipe: composable, functional datapipes for speech training data.

Importing speechpipe registers every functional name (``open``, ``list_shards``,
``parse_scp``, ``read_shards``, ``decode``, ...) on torch's ``IterDataPipe``.
"""

__version__ = "0.1.0"

from .pipes import (  # noqa: E402,F401  (registration)
    audio, augment, batching, cmvn, collate, decode, device, distributed, features, kaldi,
    kaldi_tables, manifests, mixing, order, sample_lists, sharding, shards, sources, text,
    text_normalization, threads, tokenizers, views,
)
from .epochs import set_epoch  # noqa: E402

__all__ = ["set_epoch"]
