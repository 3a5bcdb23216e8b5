"""Transcripts: normalisation, tokenizers, tokenization on the fly.

This is the package's face: other packages and
users import from here, never from its ``_modules``.
"""

from ._normalize import (
    CASES, is_cjk, REMOVE_SPACES, TextNormalizer, TranscriptNormalizer,
    TranscriptNormalizerIterDataPipe, UNICODE_FORMS,
)
from ._tokenize import (
    read_transcripts, Tokenizer, TokenizerIterDataPipe, TokenStats, UnknownTokenWarning,
)
from ._tokenizers import (
    BaseTokenizer, BLANK, build_tokenizer, CharTokenizer, load_tokenizer,
    SentencePieceTokenizer, SOS_EOS, SP_MODEL_TYPES, UNK, WordTokenizer,
)

__all__ = [
    "BLANK",
    "BaseTokenizer",
    "CASES",
    "CharTokenizer",
    "REMOVE_SPACES",
    "SOS_EOS",
    "SentencePieceTokenizer",
    "TextNormalizer",
    "TokenStats",
    "Tokenizer",
    "TokenizerIterDataPipe",
    "TranscriptNormalizer",
    "TranscriptNormalizerIterDataPipe",
    "UNICODE_FORMS",
    "UNK",
    "UnknownTokenWarning",
    "WordTokenizer",
    "build_tokenizer",
    "is_cjk",
    "load_tokenizer",
    "read_transcripts",
]
