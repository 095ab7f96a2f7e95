import pytest
from minicalc import CalcError, tokenize


def kinds_and_texts(source):
    return [(t.kind, t.text) for t in tokenize(source)]


def test_numbers_names_and_operators():
    assert kinds_and_texts("x1 + 2.5*y") == [
        ("name", "x1"), ("op", "+"), ("number", "2.5"), ("op", "*"), ("name", "y"), ("end", ""),
    ]


def test_two_character_operators_win():
    assert [t.text for t in tokenize("a**b//c<=d")][:-1] == ["a", "**", "b", "//", "c", "<=", "d"]


def test_positions():
    assert [t.position for t in tokenize(" 12 +  x")] == [1, 4, 7, 8]


def test_leading_dot_number():
    assert kinds_and_texts(".5") == [("number", ".5"), ("end", "")]


def test_two_decimal_points():
    with pytest.raises(CalcError) as error:
        tokenize("1.2.3")
    assert error.value.position == 3


def test_unexpected_character():
    with pytest.raises(CalcError, match="unexpected character '\\$'") as error:
        tokenize("1 + $")
    assert error.value.position == 4
