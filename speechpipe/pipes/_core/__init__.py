"""The DataPipe base, the state protocol, the restore driver and the graph walk.

This is the package's face: other packages and
users import from here, never from its ``_modules``.
"""

from ._base import (
    apply_random_seed, functional_datapipe, IterableWrapper, IterDataPipe, MapDataPipe,
    plain_iterator, registered_iter_names, registered_map_names, SequenceWrapper,
)
from ._buffering import Buffering, decode_held, encode_held, held_identities
from ._fingerprint import (
    allows_change, check_allow_changes, describe_differences, Difference, differences,
    fingerprint, FINGERPRINT_VERSION, refusal, stage_fields,
)
from ._graph import GRAPH_CONTAINER_MAX, graph_nodes, propagate_epoch
from ._restore import (
    end_pass, HOLDING_NOTHING, holds_nothing, restore, resumable_stages, ResumeWarning,
    take_states, UNRESUMABLE, unresumable_reason,
)
from ._state import (
    check_seed, EpochWarning, held_sample, Identity, identity, identity_list, Resumable,
    rng_state, SampleSource, Seeded, until_end,
)

__all__ = [
    "Buffering",
    "Difference",
    "EpochWarning",
    "FINGERPRINT_VERSION",
    "GRAPH_CONTAINER_MAX",
    "HOLDING_NOTHING",
    "Identity",
    "IterDataPipe",
    "IterableWrapper",
    "MapDataPipe",
    "Resumable",
    "ResumeWarning",
    "SampleSource",
    "Seeded",
    "SequenceWrapper",
    "UNRESUMABLE",
    "allows_change",
    "apply_random_seed",
    "check_allow_changes",
    "check_seed",
    "decode_held",
    "describe_differences",
    "differences",
    "encode_held",
    "end_pass",
    "fingerprint",
    "functional_datapipe",
    "graph_nodes",
    "held_identities",
    "held_sample",
    "holds_nothing",
    "identity",
    "identity_list",
    "plain_iterator",
    "propagate_epoch",
    "refusal",
    "registered_iter_names",
    "registered_map_names",
    "restore",
    "resumable_stages",
    "rng_state",
    "stage_fields",
    "take_states",
    "unresumable_reason",
    "until_end",
]
