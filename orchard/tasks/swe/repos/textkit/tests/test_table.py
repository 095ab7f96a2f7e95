from textkit import format_table


def test_table_with_headers():
    text = format_table([["apples", 3], ["kiwis", 12]], headers=["fruit", "n"])
    assert text.splitlines() == [
        "fruit    n",
        "------  --",
        "apples   3",
        "kiwis   12",
    ]


def test_floats_use_precision():
    assert format_table([[1.5], [10.25]], precision=1).splitlines() == [" 1.5", "10.2"]


def test_short_rows_and_none():
    text = format_table([["a", None, "c"], ["bb"]], headers=["x", "y", "z"])
    assert text.splitlines() == ["x   y  z", "--  -  -", "a      c", "bb"]


def test_mixed_column_is_left_aligned():
    assert format_table([[1], ["xyz"]]).splitlines() == ["1", "xyz"]


def test_booleans_are_not_numbers():
    assert format_table([[True], [10]]).splitlines() == ["True", "10"]


def test_empty_table():
    assert format_table([]) == ""
    assert format_table([], headers=["a", "b"]).splitlines() == ["a  b", "-  -"]


def test_custom_separator():
    assert format_table([["a", "b"]], separator=" | ") == "a | b"
