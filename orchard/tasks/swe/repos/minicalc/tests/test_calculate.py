import pytest
from minicalc import CalcError, calculate, parse


def test_precedence():
    assert calculate("1 + 2 * 3") == 7
    assert calculate("(1 + 2) * 3") == 9
    assert calculate("10 - 4 - 3") == 3
    assert calculate("2 * 3 % 4") == 2


def test_power_is_right_associative():
    assert calculate("2 ** 3 ** 2") == 512
    assert calculate("(2 ** 3) ** 2") == 64


def test_unary_minus():
    assert calculate("-3 + 5") == 2
    assert calculate("-2 ** 2") == -4  # like Python: -(2 ** 2)
    assert calculate("2 * -3") == -6
    assert calculate("+4") == 4


def test_division_kinds():
    assert calculate("7 / 2") == 3.5
    assert calculate("7 // 2") == 3
    assert calculate("-7 // 2") == -4
    assert calculate("7 % 3") == 1


def test_division_by_zero():
    for expression in ("1 / 0", "1 // 0", "1 % 0"):
        with pytest.raises(CalcError, match="division by zero"):
            calculate(expression)


def test_variables():
    assert calculate("2 * (x + 1) ** 2", x=3) == 32
    with pytest.raises(CalcError, match="undefined variable 'y'"):
        calculate("y + 1")


def test_comparisons():
    assert calculate("1 + 1 == 2") is True
    assert calculate("3 < 2") is False
    assert calculate("2 <= 2") is True
    assert calculate("2 >= 3") is False
    assert calculate("x != 1", x=1) is False


def test_functions():
    assert calculate("abs(-4)") == 4
    assert calculate("max(1, 7, 3)") == 7
    assert calculate("min(4, x)", x=-1) == -1
    assert calculate("sqrt(16)") == 4.0


def test_round_half_away_from_zero():
    assert calculate("round(2.5)") == 3
    assert calculate("round(-2.5)") == -3
    assert calculate("round(1.25, 1)") == 1.3


def test_function_arity():
    with pytest.raises(CalcError, match="takes"):
        calculate("abs(1, 2)")
    with pytest.raises(CalcError, match="takes"):
        calculate("max()")


def test_unknown_function():
    with pytest.raises(CalcError, match="unknown function 'foo'"):
        calculate("foo(1)")


def test_sqrt_of_negative():
    with pytest.raises(CalcError, match="negative"):
        calculate("sqrt(-1)")


def test_parse_tree_shape():
    assert parse("1 + x * 2") == ("bin", "+", ("num", 1), ("bin", "*", ("var", "x"), ("num", 2)))
    assert parse("f(1, 2)") == ("call", "f", [("num", 1), ("num", 2)])


def test_syntax_errors_name_the_position():
    with pytest.raises(CalcError) as error:
        calculate("(1 + 2")
    assert error.value.position == 6 and "expected ')'" in str(error.value)
    with pytest.raises(CalcError) as error:
        calculate("1 2")
    assert error.value.position == 2
