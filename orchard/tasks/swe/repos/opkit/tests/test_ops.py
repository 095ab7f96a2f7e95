from opkit.ops import (
    above_2,
    above_3,
    above_4,
    above_5,
    above_6,
    above_7,
    above_8,
    above_9,
    add_2,
    add_3,
    add_4,
    add_5,
    add_6,
    add_7,
    add_8,
    add_9,
    at_least_2,
    at_least_3,
    at_least_4,
    at_least_5,
    at_least_6,
    at_least_7,
    at_least_8,
    at_least_9,
    at_most_2,
    at_most_3,
    at_most_4,
    at_most_5,
    at_most_6,
    at_most_7,
    at_most_8,
    at_most_9,
    below_2,
    below_3,
    below_4,
    below_5,
    below_6,
    below_7,
    below_8,
    below_9,
    mul_2,
    mul_3,
    mul_4,
    mul_5,
    mul_6,
    mul_7,
    mul_8,
    mul_9,
    sub_2,
    sub_3,
    sub_4,
    sub_5,
    sub_6,
    sub_7,
    sub_8,
    sub_9,
)


def test_add_2():
    assert add_2(2) == 4


def test_add_3():
    assert add_3(2) == 5


def test_add_4():
    assert add_4(2) == 6


def test_add_5():
    assert add_5(2) == 7


def test_add_6():
    assert add_6(2) == 8


def test_add_7():
    assert add_7(2) == 9


def test_add_8():
    assert add_8(2) == 10


def test_add_9():
    assert add_9(2) == 11


def test_sub_2():
    assert sub_2(10) == 8


def test_sub_3():
    assert sub_3(10) == 7


def test_sub_4():
    assert sub_4(10) == 6


def test_sub_5():
    assert sub_5(10) == 5


def test_sub_6():
    assert sub_6(10) == 4


def test_sub_7():
    assert sub_7(10) == 3


def test_sub_8():
    assert sub_8(10) == 2


def test_sub_9():
    assert sub_9(10) == 1


def test_mul_2():
    assert mul_2(2) == 4


def test_mul_3():
    assert mul_3(2) == 6


def test_mul_4():
    assert mul_4(2) == 8


def test_mul_5():
    assert mul_5(2) == 10


def test_mul_6():
    assert mul_6(2) == 12


def test_mul_7():
    assert mul_7(2) == 14


def test_mul_8():
    assert mul_8(2) == 16


def test_mul_9():
    assert mul_9(2) == 18


def test_above_2():
    assert above_2(3) is True
    assert above_2(2) is False


def test_above_3():
    assert above_3(4) is True
    assert above_3(3) is False


def test_above_4():
    assert above_4(5) is True
    assert above_4(4) is False


def test_above_5():
    assert above_5(6) is True
    assert above_5(5) is False


def test_above_6():
    assert above_6(7) is True
    assert above_6(6) is False


def test_above_7():
    assert above_7(8) is True
    assert above_7(7) is False


def test_above_8():
    assert above_8(9) is True
    assert above_8(8) is False


def test_above_9():
    assert above_9(10) is True
    assert above_9(9) is False


def test_at_least_2():
    assert at_least_2(2) is True
    assert at_least_2(1) is False


def test_at_least_3():
    assert at_least_3(3) is True
    assert at_least_3(2) is False


def test_at_least_4():
    assert at_least_4(4) is True
    assert at_least_4(3) is False


def test_at_least_5():
    assert at_least_5(5) is True
    assert at_least_5(4) is False


def test_at_least_6():
    assert at_least_6(6) is True
    assert at_least_6(5) is False


def test_at_least_7():
    assert at_least_7(7) is True
    assert at_least_7(6) is False


def test_at_least_8():
    assert at_least_8(8) is True
    assert at_least_8(7) is False


def test_at_least_9():
    assert at_least_9(9) is True
    assert at_least_9(8) is False


def test_below_2():
    assert below_2(1) is True
    assert below_2(2) is False


def test_below_3():
    assert below_3(2) is True
    assert below_3(3) is False


def test_below_4():
    assert below_4(3) is True
    assert below_4(4) is False


def test_below_5():
    assert below_5(4) is True
    assert below_5(5) is False


def test_below_6():
    assert below_6(5) is True
    assert below_6(6) is False


def test_below_7():
    assert below_7(6) is True
    assert below_7(7) is False


def test_below_8():
    assert below_8(7) is True
    assert below_8(8) is False


def test_below_9():
    assert below_9(8) is True
    assert below_9(9) is False


def test_at_most_2():
    assert at_most_2(2) is True
    assert at_most_2(3) is False


def test_at_most_3():
    assert at_most_3(3) is True
    assert at_most_3(4) is False


def test_at_most_4():
    assert at_most_4(4) is True
    assert at_most_4(5) is False


def test_at_most_5():
    assert at_most_5(5) is True
    assert at_most_5(6) is False


def test_at_most_6():
    assert at_most_6(6) is True
    assert at_most_6(7) is False


def test_at_most_7():
    assert at_most_7(7) is True
    assert at_most_7(8) is False


def test_at_most_8():
    assert at_most_8(8) is True
    assert at_most_8(9) is False


def test_at_most_9():
    assert at_most_9(9) is True
    assert at_most_9(10) is False
