from textkit import plural, slugify, truncate


def test_truncate_short_text_unchanged():
    assert truncate("hello", 5) == "hello"


def test_truncate_at_word_boundary():
    assert truncate("the quick brown fox", 15) == "the quick..."


def test_truncate_mid_word_when_no_good_boundary():
    assert truncate("abcdefghijklmnop", 10) == "abcdefg..."
    assert truncate("a bcdefghijklmnop", 10) == "a bcdef..."


def test_truncate_tiny_width():
    assert truncate("hello world", 2) == ".."
    assert truncate("hello world", 6, ellipsis="~") == "hello~"


def test_slugify():
    assert slugify("Hello, World!") == "hello-world"
    assert slugify("  Crème brûlée  recipe ") == "creme-brulee-recipe"
    assert slugify("A/B testing", separator="_") == "a_b_testing"


def test_plural_regular_and_one():
    assert plural(1, "apple") == "1 apple"
    assert plural(0, "apple") == "0 apples"
    assert plural(2, "apple") == "2 apples"


def test_plural_endings():
    assert plural(3, "box") == "3 boxes"
    assert plural(2, "church") == "2 churches"
    assert plural(2, "city") == "2 cities"
    assert plural(2, "day") == "2 days"


def test_plural_irregular():
    assert plural(2, "child") == "2 children"
    assert plural(5, "mouse") == "5 mice"
