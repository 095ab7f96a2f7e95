import pytest
from textkit import indent, justify, wrap


def test_wrap_greedy():
    assert wrap("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]


def test_wrap_exact_fit():
    assert wrap("aaaa bbbbb", 10) == ["aaaa bbbbb"]
    assert wrap("aaaa bbbbbb", 10) == ["aaaa", "bbbbbb"]


def test_wrap_collapses_whitespace():
    assert wrap("  one \n two\tthree  ", 20) == ["one two three"]
    assert wrap("", 5) == []


def test_wrap_breaks_long_words():
    assert wrap("abcdefghij xy", 4) == ["abcd", "efgh", "ij", "xy"]


def test_wrap_rejects_bad_width():
    with pytest.raises(ValueError, match="width"):
        wrap("text", 0)


def test_justify_spreads_spaces_left_first():
    assert justify("a bb ccc", 11) == "a   bb  ccc"
    assert justify("a bb ccc", 10) == "a  bb  ccc"
    assert len(justify("one two three four", 25)) == 25


def test_justify_single_word_is_padded():
    assert justify("word", 6) == "word  "


def test_justify_too_narrow():
    with pytest.raises(ValueError, match="does not fit"):
        justify("aaa bbb", 6)


def test_indent_skips_blank_lines():
    assert indent("a\n\nb\n", "> ") == "> a\n\n> b\n"
    assert indent("a\n\nb", "> ", skip_blank=False) == "> a\n> \n> b"
