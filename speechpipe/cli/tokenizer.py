"""``speechpipe tokenizer`` (its code moves here from ``pipes.text``)."""

from ..pipes.text import add_tokenizer_command as add_command  # noqa: F401

__all__ = ["add_command"]
