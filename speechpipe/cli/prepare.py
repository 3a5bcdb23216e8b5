"""``speechpipe prepare`` (its code moves here from ``recipes._common``)."""

from ..recipes._common import add_prepare_command as add_command  # noqa: F401

__all__ = ["add_command"]
