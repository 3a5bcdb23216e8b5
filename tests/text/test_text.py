"""Text: normalization rules, char/word/sentencepiece tokenizers, the two pipes and the CLI.

Invariants: a TextNormalizer never crashes on a str and is idempotent (without ``replace``);
a tokenizer round-trips text over its vocabulary, survives save/load and pickling unchanged,
and maps what it does not know to <unk>, which ``tokenize`` counts and reports; bad input
raises DataError naming the file or the sample's key.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import pickle
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speechpipe.cli.tokenizer import add_command as add_tokenizer_command
from speechpipe.diagnostics import SkippedInputWarning
from speechpipe.errors import DataError, MissingDataError
from speechpipe.pipes._core import IterableWrapper, registered_iter_names
from speechpipe.pipes.text import (
    TokenizerIterDataPipe,
    TokenStats,
    UnknownTokenWarning,
    read_transcripts,
)
from speechpipe.pipes.text import is_cjk, TextNormalizer, TranscriptNormalizerIterDataPipe
from speechpipe.pipes.text import (
    build_tokenizer, CharTokenizer, load_tokenizer, SentencePieceTokenizer, WordTokenizer,
)

ZH = ["我爱北京天安门", "今天天气很好", "我们在北京", "你好世界", "天安门广场很大"]
EN = ["the cat sat on the mat", "a dog ran", "the dog sat", "cats and dogs", "on a mat"] * 4


def _samples(texts, prefix="u"):
    return [{"key": f"{prefix}{i}", "text": t} for i, t in enumerate(texts)]


def _zh_char_sp(**options):
    """A Chinese character sentencepiece model trained on text without spaces (as in CAT)."""
    return SentencePieceTokenizer.build(ZH, model_type="char", character_coverage=1.0,
                                        add_dummy_prefix=False, **options)


# --------------------------------------------------------------------------- normalizer


def test_nfkc_makes_fullwidth_ascii_and_can_be_turned_off():
    assert TextNormalizer()("ＡＢＣ１２ ﬁne") == "ABC12 fine"
    raw = TextNormalizer(unicode_form=None)
    assert raw("ＡＢＣ１２ ﬁne") == "ＡＢＣ１２ ﬁne"


def test_case_upper_lower_keep():
    assert TextNormalizer(case="upper")("Hello World") == "HELLO WORLD"
    assert TextNormalizer(case="lower")("Hello World") == "hello world"
    assert TextNormalizer(case="keep")("Hello World") == "Hello World"


def test_remove_punctuation_replaces_p_categories_by_spaces_and_keeps_symbols():
    n = TextNormalizer(remove_punctuation=True)
    assert n("Hello, world! (yes)") == "Hello world yes"
    assert n("well-known") == "well known"
    assert TextNormalizer(remove_punctuation=True, unicode_form=None)("你好，世界。") == "你好 世界"
    assert n("<a> +1$") == "<a> +1$"  # Sm/Sc symbols are not punctuation
    assert TextNormalizer()("Hello, world!") == "Hello, world!"  # off by default


def test_apostrophes_inside_words_are_kept_unless_asked():
    n = TextNormalizer(remove_punctuation=True)
    assert n("don't 'quote' rock'n'roll it’s") == "don't quote rock'n'roll it’s"
    assert n("dogs' bones") == "dogs bones"
    off = TextNormalizer(remove_punctuation=True, keep_apostrophes=False)
    assert off("don't rock'n'roll") == "don t rock n roll"


def test_collapse_spaces_merges_runs_and_strips_or_leaves_them():
    assert TextNormalizer()("  a \t b\n") == "a b"
    assert TextNormalizer(collapse_spaces=False)("  a \t b\n") == "  a \t b\n"


def test_remove_spaces_all():
    assert TextNormalizer(remove_spaces="all")(" a b 我 爱\t") == "ab我爱"


def test_remove_spaces_cjk_removes_spaces_next_to_cjk_and_keeps_english_word_spaces():
    n = TextNormalizer(remove_spaces="cjk")
    assert n("我 爱 NLP 和 speech") == "我爱NLP和speech"
    assert n("hello world 你好 世界 ok go") == "hello world你好世界ok go"
    assert n("これは テスト です") == "これはテストです"  # kana count as CJK
    assert n("안녕 하세요") == "안녕 하세요"  # Hangul does not: Korean separates words
    assert n("我　爱") == "我爱"  # the ideographic space (NFKC'd or not) is a space
    runs = TextNormalizer(remove_spaces="cjk", collapse_spaces=False)
    assert runs("我 \t 爱  a  b") == "我爱a  b"


def test_is_cjk_covers_han_kana_and_extensions_but_not_hangul_or_latin():
    assert all(is_cjk(c) for c in "我爱かカ㐀\U00020000。")
    assert not any(is_cjk(c) for c in "aZ1 한ä")


def test_drop_tags_removes_gigaspeech_tags():
    n = TextNormalizer(drop_tags=("<SIL>", "<NOISE>"))
    assert n("<SIL> HELLO <NOISE> WORLD <SIL>") == "HELLO WORLD"
    assert n("<SIL>") == ""


def test_drop_tags_are_compared_after_case_mapping():
    assert TextNormalizer(case="lower", drop_tags=("<SIL>",))("<sil> Hi <SIL>") == "hi"
    assert TextNormalizer(drop_tags=("<SIL>",))("<sil> hi") == "<sil> hi"  # case kept: exact


def test_drop_tags_run_before_punctuation_and_again_after_spaces_are_removed():
    n = TextNormalizer(remove_punctuation=True, drop_tags=("[noise]",))
    assert n("[noise] yes, [noise]") == "yes"
    joined = TextNormalizer(remove_spaces="all", drop_tags=("<SIL>",))
    assert joined("<SI L>ab") == "ab"  # the tag appears only once spaces are gone


def test_replace_applies_in_order_before_case_mapping():
    n = TextNormalizer(case="lower", replace={"<COMMA>": ",", "Mr.": "mister"})
    assert n("HI<COMMA> Mr. X") == "hi, mister x"
    pairs = TextNormalizer(replace=[("a", "b"), ("b", "c")])
    assert pairs("a") == "c"
    assert pairs.replace == (("a", "b"), ("b", "c"))


@pytest.mark.parametrize("kwargs, exc, word", [
    ({"case": "title"}, ValueError, "case"),
    ({"unicode_form": "NFX"}, ValueError, "unicode_form"),
    ({"remove_spaces": "some"}, ValueError, "remove_spaces"),
    ({"remove_punctuation": 1}, TypeError, "remove_punctuation"),
    ({"drop_tags": "<SIL>"}, TypeError, "drop_tags"),
    ({"drop_tags": ("a b",)}, ValueError, "drop_tags"),
    ({"replace": {"": "x"}}, ValueError, "replace"),
    ({"replace": "ab"}, TypeError, "replace"),
])
def test_normalizer_rejects_bad_options_naming_them(kwargs, exc, word):
    with pytest.raises(exc, match=word):
        TextNormalizer(**kwargs)


def test_normalizer_is_frozen_hashable_and_pickles():
    n = TextNormalizer(case="upper", drop_tags=["<SIL>"], replace={"a": "b"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        n.case = "lower"  # type: ignore[misc]
    copy = pickle.loads(pickle.dumps(n))
    assert copy == n and hash(copy) == hash(n)
    assert copy("a <sil> c") == n("a <sil> c") == "B C"


def test_normalizer_rejects_non_str():
    with pytest.raises(TypeError, match="expects a str"):
        TextNormalizer()(b"bytes")  # type: ignore[arg-type]


NORMALIZERS = [
    TextNormalizer(),
    TextNormalizer(case="upper", remove_punctuation=True, remove_spaces="cjk"),
    TextNormalizer(case="lower", remove_punctuation=True, keep_apostrophes=False,
                   remove_spaces="all", drop_tags=("<SIL>", "[noise]")),
    TextNormalizer(unicode_form=None, collapse_spaces=False, remove_spaces="cjk",
                   remove_punctuation=True, case="upper"),
    TextNormalizer(unicode_form="NFD", case="upper", drop_tags=("<sil>", "ss")),
]
_TRICKY = list("<SIL>[noise] 我爱'’.,ab\u0301\u3099かΐǰßﬁ¨゛\t\u3000")


@pytest.mark.parametrize("normalizer", NORMALIZERS, ids=range(len(NORMALIZERS)))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(st.one_of(st.characters(), st.sampled_from(_TRICKY))))
def test_normalizer_never_crashes_and_is_idempotent(normalizer, text):
    once = normalizer(text)
    assert isinstance(once, str)
    assert normalizer(once) == once


# --------------------------------------------------------------------------- normalize_text


def test_normalize_text_replaces_the_field_in_a_copy():
    source = _samples(["我 爱 NLP", "Hi , there"])
    out = list(IterableWrapper(source).normalize_text(remove_spaces="cjk", case="upper"))
    assert [s["text"] for s in out] == ["我爱NLP", "HI , THERE"]
    assert [s["key"] for s in out] == ["u0", "u1"]
    assert source[0]["text"] == "我 爱 NLP"  # the input samples are not modified


def test_normalize_text_takes_a_normalizer_and_another_field():
    n = TextNormalizer(case="lower")
    pipe = IterableWrapper([{"key": "a", "transcript": "ABC", "text": "KEEP"}])
    (out,) = pipe.normalize_text(n, field="transcript")
    assert out["transcript"] == "abc" and out["text"] == "KEEP"


def test_normalize_text_rejects_a_normalizer_with_options():
    with pytest.raises(ValueError, match="either a normalizer or"):
        TranscriptNormalizerIterDataPipe(IterableWrapper([]), TextNormalizer(), case="upper")


def test_normalize_text_without_the_field_names_the_key():
    pipe = IterableWrapper([{"key": "utt7", "source": "a.tar"}]).normalize_text()
    with pytest.raises(DataError, match=r"a.tar \(key 'utt7'\): sample has no field 'text'"):
        list(pipe)


def test_normalize_text_with_non_str_text_names_the_key():
    pipe = IterableWrapper([{"key": "utt8", "text": b"bytes"}]).normalize_text()
    with pytest.raises(DataError, match=r"key 'utt8'.*field 'text' is a bytes, expected str"):
        list(pipe)


def test_normalize_text_skip_counts_and_warns():
    pipe = IterableWrapper([{"key": "a"}, {"key": "b", "text": "x"}]).normalize_text(
        on_error="skip")
    with pytest.warns(SkippedInputWarning, match="normalize_text skipped 1"):
        assert [s["key"] for s in pipe] == ["b"]
    assert pipe.diagnostics.counts["no text"] == 1


def test_normalize_text_length_is_the_source_length_unless_skipping():
    assert len(IterableWrapper(_samples(["a", "b"])).normalize_text()) == 2
    with pytest.raises(TypeError, match="skip"):
        len(IterableWrapper(_samples(["a"])).normalize_text(on_error="skip"))


# --------------------------------------------------------------------------- char / word


def test_char_vocab_follows_the_wenet_layout():
    tok = CharTokenizer.build(["ba c", "ca"])
    assert tok.vocab == ("<blank>", "<unk>", "a", "b", "c", "▁", "<sos/eos>")
    assert (tok.blank_id, tok.unk_id, tok.sos_eos_id, tok.vocab_size) == (0, 1, 6, 7)


def test_char_round_trip_and_unknown_characters():
    tok = CharTokenizer.build(EN)
    ids = tok.encode("the cat")
    assert tok.decode(ids) == "the cat"
    assert tok.encode("z") == [tok.unk_id]
    assert tok.unknown_symbols("zed q") == ["z", "q"]
    assert tok.decode([tok.blank_id, *tok.encode("a"), tok.sos_eos_id]) == "a"
    assert tok.decode([tok.unk_id]) == "<unk>"


def test_char_without_space_symbol_drops_spaces():
    tok = CharTokenizer.build(["ab c"], space_symbol=None)
    assert "▁" not in tok.vocab
    assert tok.decode(tok.encode("a b\tc")) == "abc"


def test_char_built_without_spaces_maps_a_space_to_unk():
    tok = CharTokenizer.build(ZH)
    assert tok.encode("我 爱")[1] == tok.unk_id
    assert tok.unknown_symbols("我 爱") == [" "]


def test_char_min_count_and_max_size():
    tok = CharTokenizer.build(["aaab", "aab c"], min_count=2)
    assert tok.vocab[2:-1] == ("a", "b")  # one space: "▁" seen once
    top = CharTokenizer.build(["aaab", "aab c"], max_size=1)
    assert top.vocab[2:-1] == ("a",)


def test_char_decode_rejects_ids_outside_the_vocabulary():
    tok = CharTokenizer.build(["ab"])
    with pytest.raises(ValueError, match="token id 99 is outside"):
        tok.decode([99])


def test_word_tokenizer_builds_encodes_and_decodes():
    tok = WordTokenizer.build(EN, min_count=2)
    assert tok.vocab[0] == "<blank>" and tok.vocab[1] == "<unk>" and tok.vocab[-1] == "<sos/eos>"
    assert list(tok.vocab[2:-1]) == sorted(tok.vocab[2:-1])
    assert tok.decode(tok.encode("the  dog sat\n")) == "the dog sat"
    assert tok.encode("the zebra") == [tok.vocab.index("the"), tok.unk_id]
    assert tok.unknown_symbols("the zebra ran") == ["zebra"]


def test_word_max_size_keeps_the_most_frequent_and_specials_are_unknown():
    tok = WordTokenizer.build(["b b b a a c <unk> <blank> <sos/eos>"], max_size=2)
    assert tok.vocab == ("<blank>", "<unk>", "a", "b", "<sos/eos>")
    assert tok.encode("<blank> <sos/eos> b") == [1, 1, 3]


@pytest.mark.parametrize("build, kwargs, word", [
    (CharTokenizer.build, {"min_count": 0}, "min_count"),
    (WordTokenizer.build, {"max_size": 0}, "max_size"),
    (CharTokenizer.build, {"space_symbol": "  "}, "space_symbol"),
])
def test_build_rejects_bad_arguments(build, kwargs, word):
    with pytest.raises(ValueError, match=word):
        build(["ab"], **kwargs)


def test_build_rejects_non_str_texts():
    with pytest.raises(TypeError, match=r"texts\[1\] is a int"):
        CharTokenizer.build(["a", 3])
    with pytest.raises(TypeError, match="not one str"):
        WordTokenizer.build("a b")


# Invariant: decode(encode(x)) == x for any text over the tokenizer's characters and spaces.
_CHAR_TOK = CharTokenizer.build(EN + ZH + ["ÄÖü 1,2'"])
_VOCAB_CHARS = [c for c in _CHAR_TOK.vocab[2:-1] if c != "▁"]


@settings(max_examples=200, deadline=None)
@given(st.text(st.sampled_from(_VOCAB_CHARS + [" "])))
def test_char_decode_inverts_encode_over_the_vocabulary(text):
    ids = _CHAR_TOK.encode(text)
    assert _CHAR_TOK.unk_id not in ids
    assert _CHAR_TOK.decode(ids) == text


# --------------------------------------------------------------------------- sentencepiece


@pytest.mark.parametrize("model_type, size", [("unigram", 20), ("bpe", 20), ("char", None)])
def test_sentencepiece_builds_with_the_id_convention_and_round_trips(model_type, size):
    tok = SentencePieceTokenizer.build(EN, size, model_type=model_type, character_coverage=1.0)
    assert (tok.blank_id, tok.unk_id) == (0, 1)
    assert tok.sos_eos_id == tok.vocab_size - 1
    assert [tok.id_to_piece(i) for i in (0, 1, tok.vocab_size - 1)] == [
        "<blank>", "<unk>", "<sos/eos>"]
    if size is not None:
        assert tok.vocab_size == size
    for text in EN[:5]:
        ids = tok.encode(text)
        assert tok.unk_id not in ids and tok.decode(ids) == text


def test_sentencepiece_training_is_deterministic_and_writes_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = SentencePieceTokenizer.build(EN, 20)
    second = SentencePieceTokenizer.build(list(EN), 20)
    assert first.model_proto == second.model_proto
    assert list(tmp_path.iterdir()) == []


def test_sentencepiece_rejects_a_vocab_size_too_large_saying_the_maximum():
    with pytest.raises(ValueError, match=r"vocab_size 500 is too large .* at most \d+ pieces"
                       ) as info:
        SentencePieceTokenizer.build(EN, 500)
    most = int(info.value.args[0].split("at most ")[1].split()[0])
    assert SentencePieceTokenizer.build(EN, most).vocab_size == most  # the maximum is right
    with pytest.raises(ValueError, match="too large"):
        SentencePieceTokenizer.build(EN, most + 1)


@pytest.mark.parametrize("args, kwargs, word", [
    ((), {}, "vocab_size is required"),
    ((2,), {}, "vocab_size must be"),
    ((40,), {"model_type": "word"}, "model_type"),
    ((40,), {"character_coverage": 0}, "character_coverage"),
    ((40,), {"eos_id": 3}, r"\['eos_id'\] are set by"),
])
def test_sentencepiece_build_rejects_bad_arguments(args, kwargs, word):
    with pytest.raises(ValueError, match=word):
        SentencePieceTokenizer.build(EN, *args, **kwargs)


def test_sentencepiece_build_without_text_says_so():
    with pytest.raises(ValueError, match="no non-empty text"):
        SentencePieceTokenizer.build(["", ""], 10)


def test_sentencepiece_pickles_its_bytes_and_loads_the_processor_lazily():
    tok = _zh_char_sp()
    copy = pickle.loads(pickle.dumps(tok))
    assert copy._sp is None  # nothing built until used, e.g. in a DataLoader worker
    assert copy == tok and copy.encode("我爱北京") == tok.encode("我爱北京")


def test_sentencepiece_rejects_bytes_that_are_not_a_model():
    with pytest.raises(ValueError, match="not a sentencepiece model"):
        SentencePieceTokenizer(b"garbage")


# The seed's warning (CAT, large-dataset notes): a Chinese character sentencepiece model
# trained without spaces maps a space left in a label to <unk>; removing spaces fixes it.
def test_chinese_space_becomes_unk_and_remove_spaces_cjk_fixes_it():
    tok = _zh_char_sp()
    ids = tok.encode("我 爱")
    assert ids[1] == tok.unk_id and tok.unk_id not in tok.encode("我爱")
    assert tok.unknown_symbols("我 爱") == [" "]
    fixed = TextNormalizer(remove_spaces="cjk")("我 爱 北京")
    assert tok.unk_id not in tok.encode(fixed)


def test_tokenize_reports_and_warns_about_chinese_spaces_and_not_once_normalized():
    tok = _zh_char_sp()
    samples = _samples(["我 爱 北京", "你好 世界", "天安门"])
    pipe = IterableWrapper(samples).tokenize(tok)
    with pytest.warns(UnknownTokenWarning, match="spaces became <unk>"):
        list(pipe)
    assert (pipe.stats.samples, pipe.stats.samples_with_unk, pipe.stats.unk_tokens) == (3, 2, 3)
    assert "' ' (U+0020) x3" in pipe.stats.report()
    fixed = IterableWrapper(samples).tokenize(tok, normalizer=TextNormalizer(remove_spaces="cjk"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = list(fixed)
    assert fixed.stats.unk_tokens == 0 and "no <unk>" in fixed.stats.report()
    assert out[0]["text"] == "我 爱 北京"  # only what is encoded is normalized


# --------------------------------------------------------------------------- save / load


def _all_tokenizers():
    return [CharTokenizer.build(EN), CharTokenizer.build(EN, space_symbol=None),
            WordTokenizer.build(EN), SentencePieceTokenizer.build(EN, 20)]


@pytest.mark.parametrize("index", range(4))
def test_save_then_load_gives_an_equal_tokenizer(tmp_path, index):
    tok = _all_tokenizers()[index]
    path = tmp_path / "tok"
    tok.save(path)
    loaded = load_tokenizer(path)
    assert type(loaded) is type(tok) and loaded == tok
    assert type(tok).load(path) == tok
    assert loaded.encode("the cat sat") == tok.encode("the cat sat")


def test_saved_char_file_is_readable_json(tmp_path):
    CharTokenizer.build(["ab"]).save(tmp_path / "c.json")
    obj = json.loads((tmp_path / "c.json").read_text(encoding="utf-8"))
    assert obj == {"type": "char", "format_version": 1, "space_symbol": "▁",
                   "vocab": ["<blank>", "<unk>", "a", "b", "<sos/eos>"]}


@pytest.mark.parametrize("index", range(4))
def test_tokenizers_pickle_to_equal_objects(index):
    tok = _all_tokenizers()[index]
    copy = pickle.loads(pickle.dumps(tok))
    assert copy == tok and copy.encode("a dog") == tok.encode("a dog")


def test_load_of_another_kind_names_the_file(tmp_path):
    path = tmp_path / "words.json"
    WordTokenizer.build(EN).save(path)
    with pytest.raises(DataError, match=r"words.json: holds a word tokenizer, not a char one"):
        CharTokenizer.load(path)


@pytest.mark.parametrize("content, message", [
    (b"\x00\x01garbage", "not a tokenizer file: neither JSON"),
    (b"", "empty tokenizer file"),
    (b'{"type": "char",\n "vocab": [}', r":2: invalid JSON"),
    (b"[1, 2]", "expected a JSON object"),
    (b'{"type": "bpe", "vocab": []}', "unknown tokenizer type 'bpe'"),
    (b'{"type": "char", "format_version": 9, "vocab": []}', "format_version 9"),
    (b'{"type": "word", "vocab": "abc"}', "'vocab' must be a list"),
    (b'{"type": "word", "vocab": ["<unk>", "a", "<sos/eos>"]}', "vocab must start with"),
    (b'{"type": "word", "vocab": ["<blank>", "<unk>", "a", "a", "<sos/eos>"]}',
     "'a' appears more than once"),
    (b'{"type": "char", "vocab": ["<blank>", "<unk>", "ab", "<sos/eos>"]}',
     "vocab entry 2 'ab' is not one character"),
    (b'{"type": "word", "vocab": ["<blank>", "<unk>", "<sos/eos>"], "extra": 1}',
     r"unknown fields \['extra'\]"),
    ('{"type": "char", "vocab": []}'.encode("utf-16"), "neither JSON"),
])
def test_bad_tokenizer_files_raise_data_errors_naming_the_file(tmp_path, content, message):
    path = tmp_path / "bad.tok"
    path.write_bytes(content)
    with pytest.raises(DataError, match=message) as info:
        load_tokenizer(path)
    assert str(info.value).startswith(str(path))


def test_missing_tokenizer_file_is_missing_data(tmp_path):
    with pytest.raises(MissingDataError, match="absent.model: tokenizer file not found"):
        load_tokenizer(tmp_path / "absent.model")


# --------------------------------------------------------------------------- tokenize


def test_tokenize_writes_int64_tokens_and_keeps_the_text():
    tok = CharTokenizer.build(EN)
    out = list(IterableWrapper(_samples(["the cat", "a dog"])).tokenize(tok))
    assert [s["text"] for s in out] == ["the cat", "a dog"]
    for sample in out:
        assert sample["tokens"].dtype == np.int64 and sample["tokens"].shape == (
            len(sample["text"]),)
        assert sample["tokens"].tolist() == tok.encode(sample["text"])


def test_tokenize_field_and_out_options():
    tok = WordTokenizer.build(EN)
    (out,) = IterableWrapper([{"key": "a", "words": "the dog"}]).tokenize(
        tok, field="words", out="ids")
    assert out["ids"].tolist() == tok.encode("the dog") and "tokens" not in out


def test_tokenize_stats_are_reset_each_pass():
    tok = WordTokenizer.build(EN)
    pipe = IterableWrapper(_samples(["the zebra", "the cat", "zebra zebra"])).tokenize(
        tok, max_unk_rate=None)
    for _ in range(2):
        list(pipe)
        assert (pipe.stats.samples, pipe.stats.tokens, pipe.stats.unk_tokens,
                pipe.stats.samples_with_unk) == (3, 6, 3, 2)
        assert pipe.stats.examples == ["u0", "u2"]
        assert pipe.stats.unknown == {"zebra": 3}


def test_tokenize_warns_only_above_max_unk_rate():
    tok = WordTokenizer.build(EN)
    samples = _samples(["the zebra"] + ["the cat"] * 9)  # 1 unk in 20 tokens: 5%
    with pytest.warns(UnknownTokenWarning, match=r"1 <unk> token\(s\) \(5.00%\)"):
        list(IterableWrapper(samples).tokenize(tok, max_unk_rate=0.01))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(IterableWrapper(samples).tokenize(tok, max_unk_rate=0.1))
        list(IterableWrapper(samples).tokenize(tok, max_unk_rate=None))


def test_tokenize_without_the_field_names_the_key():
    pipe = IterableWrapper([{"key": "utt3"}]).tokenize(CharTokenizer.build(["a"]))
    with pytest.raises(DataError, match=r"key 'utt3'.*no field 'text' to tokenize"):
        list(pipe)


def test_tokenize_non_str_text_names_the_key():
    pipe = IterableWrapper([{"key": "utt4", "text": ["a"]}]).tokenize(CharTokenizer.build(["a"]))
    with pytest.raises(DataError, match=r"key 'utt4'.*field 'text' is a list, expected str"):
        list(pipe)


def test_tokenize_non_dict_element_is_a_data_error():
    with pytest.raises(DataError, match="tokenize expects sample dicts, got str"):
        list(IterableWrapper(["text"]).tokenize(CharTokenizer.build(["a"])))


def test_tokenize_skip_counts_and_warns():
    pipe = IterableWrapper([{"key": "a", "text": 3}, {"key": "b", "text": "a"}]).tokenize(
        CharTokenizer.build(["a"]), on_error="skip")
    with pytest.warns(SkippedInputWarning, match="tokenize skipped 1"):
        assert [s["key"] for s in pipe] == ["b"]


@pytest.mark.parametrize("kwargs, exc, word", [
    ({"tokenizer": 3}, TypeError, "load_tokenizer"),  # a path is taken (issue 32.11)
    ({"max_unk_rate": 2}, ValueError, "max_unk_rate"),
    ({"field": ""}, TypeError, "field"),
    ({"normalizer": "upper"}, TypeError, "normalizer"),
    ({"on_error": "ignore"}, ValueError, "on_error"),
])
def test_tokenize_rejects_bad_arguments(kwargs, exc, word):
    kwargs = {"tokenizer": CharTokenizer.build(["a"]), **kwargs}
    with pytest.raises(exc, match=word):
        TokenizerIterDataPipe(IterableWrapper([]), **kwargs)


def test_tokenize_length_is_the_source_length():
    assert len(IterableWrapper(_samples(["a", "b"])).tokenize(CharTokenizer.build(["a"]))) == 2


def test_token_stats_coverage_counts_non_space_characters():
    tok = CharTokenizer.build(["ab"])
    stats = TokenStats()
    stats.add("k", "ab xy", tok.encode("ab xy"), tok)
    assert stats.coverage == pytest.approx(0.5) and stats.unk_rate == pytest.approx(3 / 5)


def test_names_are_registered_to_our_classes_and_not_torchs():
    from speechpipe.pipes._core import IterDataPipe

    assert {"normalize_text", "tokenize"} <= registered_iter_names()
    assert IterDataPipe.functions["tokenize"].args[0] is TokenizerIterDataPipe
    assert IterDataPipe.functions["normalize_text"].args[0] is TranscriptNormalizerIterDataPipe


def test_pipes_pickle_and_run_in_spawned_dataloader_workers():
    from torch.utils.data import DataLoader

    tok = _zh_char_sp()
    texts = ["我 爱 北京", "你好 世界", "天安门", "今天 天气", "我们", "很好"]
    pipe = (IterableWrapper(_samples(texts)).sharding_filter()
            .normalize_text(remove_spaces="cjk").tokenize(tok))
    expected = {s["key"]: s["tokens"].tolist() for s in pickle.loads(pickle.dumps(pipe))}
    loader = DataLoader(pipe, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    got = {s["key"]: s["tokens"].tolist() for s in loader}
    assert got == expected and len(got) == len(texts)
    assert all(tok.unk_id not in ids for ids in got.values())


# --------------------------------------------------------------------------- CLI


def _cli(argv):
    parser = argparse.ArgumentParser(prog="speechpipe")
    add_tokenizer_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def _kaldi_text(tmp_path, lines, name="text"):
    path = tmp_path / name
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return str(path)


def test_cli_builds_a_char_tokenizer_from_a_kaldi_text_file(tmp_path, capsys):
    text = _kaldi_text(tmp_path, ["u1 我 爱 北京", "u2 你好 世界", "u3"])
    out = str(tmp_path / "chars.json")
    assert _cli(["tokenizer", "build", "--type", "char", "--text", text,
                 "--remove-spaces", "cjk", "--out", out]) == 0
    printed = capsys.readouterr().out
    tok = load_tokenizer(out)
    assert isinstance(tok, CharTokenizer) and "▁" not in tok.vocab
    assert f"vocab size: {tok.vocab_size} (<blank>=0, <unk>=1, <sos/eos>={tok.vocab_size - 1})" \
        in printed
    assert "3 transcript(s) in 1 file(s)" in printed
    assert "coverage: 100.00% of characters known; <unk> rate: 0.00%" in printed
    assert "remove_spaces='cjk'" in printed


def test_cli_builds_sentencepiece_and_word_from_several_files_and_a_manifest(tmp_path, capsys):
    text = _kaldi_text(tmp_path, [f"a{i} {t}" for i, t in enumerate(EN)])
    manifest = tmp_path / "m.jsonl.gz"
    manifest.write_bytes(gzip.compress(b'{"key": "m1", "text": "The Zebra"}\n'))
    out = str(tmp_path / "sp.model")
    assert _cli(["tokenizer", "build", "--type", "sentencepiece", "--text", text, "--text",
                 str(manifest), "--vocab-size", "20", "--case", "lower", "--out", out]) == 0
    assert isinstance(load_tokenizer(out), SentencePieceTokenizer)
    assert load_tokenizer(out).vocab_size == 20
    assert "21 transcript(s) in 2 file(s)" in capsys.readouterr().out
    words = str(tmp_path / "w.json")
    assert _cli(["tokenizer", "build", "--type", "word", "--text", text, "--vocab-size", "5",
                 "--out", words]) == 0
    assert load_tokenizer(words).vocab_size == 5


def test_cli_reports_unknowns_on_the_training_text(tmp_path, capsys):
    text = _kaldi_text(tmp_path, ["u1 a b", "u2 a c", "u3 a"])
    assert _cli(["tokenizer", "build", "--type", "word", "--text", text, "--min-count", "2",
                 "--out", str(tmp_path / "w.json")]) == 0
    printed = capsys.readouterr().out
    assert "coverage: 60.00% of characters known; <unk> rate: 40.00% of 5 token(s)" in printed
    assert "unknown symbols: 'b' x1, 'c' x1" in printed


def test_cli_help_describes_the_build_options(capsys):
    with pytest.raises(SystemExit) as info:
        _cli(["tokenizer", "build", "--help"])
    assert info.value.code == 0
    help_text = capsys.readouterr().out
    for option in ("--type", "--text", "--vocab-size", "--model-type", "--remove-spaces",
                   "--case", "--out"):
        assert option in help_text


def test_cli_bad_input_returns_2_naming_the_file_and_line(tmp_path, capsys):
    bad = tmp_path / "text"
    bad.write_bytes(b"u1 fine\nu2 \xff\xfe\n")
    assert _cli(["tokenizer", "build", "--type", "char", "--text", str(bad),
                 "--out", str(tmp_path / "c.json")]) == 2
    assert f"{bad}:2: not valid UTF-8" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


def test_cli_missing_file_and_too_large_vocab_return_2(tmp_path, capsys):
    assert _cli(["tokenizer", "build", "--type", "char", "--text", str(tmp_path / "nope"),
                 "--out", str(tmp_path / "c.json")]) == 2
    assert "nope: text file not found" in capsys.readouterr().err
    text = _kaldi_text(tmp_path, ["u1 ab", "u2 ba"])
    assert _cli(["tokenizer", "build", "--type", "sentencepiece", "--text", text,
                 "--vocab-size", "300", "--out", str(tmp_path / "s.model")]) == 2
    assert "vocab_size 300 is too large" in capsys.readouterr().err


def test_read_transcripts_manifest_without_the_field_names_line_and_key(tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"key": "a", "text": "x"}\n{"key": "b"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"m.jsonl:2 \(key 'b'\): manifest line has no field"):
        list(read_transcripts(manifest))


def test_build_tokenizer_dispatches_by_kind():
    assert isinstance(build_tokenizer("char", ["ab"]), CharTokenizer)
    with pytest.raises(ValueError, match="kind must be one of"):
        build_tokenizer("bpe", ["ab"])



# ----------------------------------------------------------------- other toolkits' vocabularies


def test_wenet_units_txt_and_espnet_token_list_load_as_tokenizers(tmp_path):
    # Issue 32.11: WeNet's units.txt and ESPnet's token_list did not load.
    from speechpipe.pipes.text import CharTokenizer
    from speechpipe.pipes.text import WordTokenizer
    from speechpipe.pipes.text import load_tokenizer

    units = tmp_path / "units.txt"
    units.write_text("<blank> 0\n<unk> 1\n▁ 2\n北 3\n京 4\n我 5\n<sos/eos> 6\n")
    tok = load_tokenizer(units)
    assert isinstance(tok, CharTokenizer) and tok.vocab_size == 7
    assert tok.encode("我 北京") == [5, 2, 3, 4] and tok.decode([5, 2, 3, 4]) == "我 北京"
    espnet = tmp_path / "tokens.txt"  # ESPnet's char token_list: '<space>' is the space
    espnet.write_text("<blank>\n<unk>\n<space>\nA\nC\nT\n<sos/eos>\n")
    tok = load_tokenizer(espnet)
    assert tok.encode("CAT A") == [4, 3, 5, 2, 3] and tok.decode([4, 3, 5, 2, 3]) == "CAT A"
    words = tmp_path / "words.txt"
    words.write_text("<blank>\n<unk>\nCAT\nTHE\n<sos/eos>\n")
    tok = load_tokenizer(words)
    assert isinstance(tok, WordTokenizer) and tok.encode("THE CAT SAT") == [3, 2, 1]


@pytest.mark.parametrize("text, message", [
    ("<blank> 0\n<unk> 1\na 3\n<sos/eos> 3\n",
     r"units.txt:3: expected 'token' or 'token id' with ids 0, 1, 2... in order \(id 2 here\)"),
    ("<blank>\n<unk>\n▁THE\n▁CAT\n<sos/eos>\n",
     r"holds BPE pieces \(such as '▁THE'\): load the sentencepiece model"),
    ("<blank>\n<unk>\na\n", r"not a vocabulary speechpipe can use: vocab must start with"),
])
def test_a_bad_vocabulary_file_is_named_with_its_line(tmp_path, text, message):
    from speechpipe.errors import DataError
    from speechpipe.pipes.text import load_tokenizer

    path = tmp_path / "units.txt"
    path.write_text(text)
    with pytest.raises(DataError, match=message):
        load_tokenizer(path)


def test_tokenize_takes_a_tokenizer_path_read_when_iterated(tmp_path):
    import speechpipe as sp

    path = tmp_path / "units.txt"
    pipe = sp.IterableWrapper([{"key": "u", "text": "ab"}]).tokenize(str(path))  # not yet there
    path.write_text("<blank> 0\n<unk> 1\na 2\nb 3\n<sos/eos> 4\n")
    assert [s["tokens"].tolist() for s in pipe] == [[2, 3]]
