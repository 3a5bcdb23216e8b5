"""``speechpipe cmvn`` (its code moves here from ``pipes.audio``)."""

from ..pipes.audio import add_cmvn_command as add_command  # noqa: F401

__all__ = ["add_command"]
