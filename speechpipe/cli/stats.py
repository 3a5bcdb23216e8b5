"""``speechpipe stats`` (its code moves here from ``stats``)."""

from ..stats import add_stats_command as add_command  # noqa: F401

__all__ = ["add_command"]
