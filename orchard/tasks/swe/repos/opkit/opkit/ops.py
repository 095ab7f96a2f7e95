"""Named one-line helpers: the name says the operation and the constant."""


def add_2(x):
    return x + 2


def add_3(x):
    return x + 3


def add_4(x):
    return x + 4


def add_5(x):
    return x + 5


def add_6(x):
    return x + 6


def add_7(x):
    return x + 7


def add_8(x):
    return x + 8


def add_9(x):
    return x + 9


def sub_2(x):
    return x - 2


def sub_3(x):
    return x - 3


def sub_4(x):
    return x - 4


def sub_5(x):
    return x - 5


def sub_6(x):
    return x - 6


def sub_7(x):
    return x - 7


def sub_8(x):
    return x - 8


def sub_9(x):
    return x - 9


def mul_2(x):
    return x * 2


def mul_3(x):
    return x * 3


def mul_4(x):
    return x * 4


def mul_5(x):
    return x * 5


def mul_6(x):
    return x * 6


def mul_7(x):
    return x * 7


def mul_8(x):
    return x * 8


def mul_9(x):
    return x * 9


def above_2(x):
    return x > 2


def above_3(x):
    return x > 3


def above_4(x):
    return x > 4


def above_5(x):
    return x > 5


def above_6(x):
    return x > 6


def above_7(x):
    return x > 7


def above_8(x):
    return x > 8


def above_9(x):
    return x > 9


def at_least_2(x):
    return x >= 2


def at_least_3(x):
    return x >= 3


def at_least_4(x):
    return x >= 4


def at_least_5(x):
    return x >= 5


def at_least_6(x):
    return x >= 6


def at_least_7(x):
    return x >= 7


def at_least_8(x):
    return x >= 8


def at_least_9(x):
    return x >= 9


def below_2(x):
    return x < 2


def below_3(x):
    return x < 3


def below_4(x):
    return x < 4


def below_5(x):
    return x < 5


def below_6(x):
    return x < 6


def below_7(x):
    return x < 7


def below_8(x):
    return x < 8


def below_9(x):
    return x < 9


def at_most_2(x):
    return x <= 2


def at_most_3(x):
    return x <= 3


def at_most_4(x):
    return x <= 4


def at_most_5(x):
    return x <= 5


def at_most_6(x):
    return x <= 6


def at_most_7(x):
    return x <= 7


def at_most_8(x):
    return x <= 8


def at_most_9(x):
    return x <= 9
