"""``speechpipe pack`` (its code moves here from ``pack``)."""

from ..pack import add_pack_command as add_command  # noqa: F401

__all__ = ["add_command"]
