"""The GUI oracle's set-of-marks calls: a point goes to the smallest listed element that holds it."""

from __future__ import annotations

from orchard.tasks.gui.oracle import element_at, mark_action

ELEMENTS = [  # as the browser lists them: centre, width, height (marks count from 1 in this order)
    {"tag": "div", "id": "wrap", "text": "", "x": 80, "y": 105, "width": 160, "height": 210},
    {"tag": "button", "id": None, "text": "OK", "x": 40, "y": 100, "width": 30, "height": 20},
    {"tag": "input", "id": "name", "text": "", "x": 100, "y": 150, "width": 80, "height": 20},
]


def test_a_point_goes_to_the_smallest_element_holding_it():
    assert element_at(ELEMENTS, 45, 105) == 2  # the button, not the wrapper around it
    assert element_at(ELEMENTS, 10, 10) == 1
    assert element_at(ELEMENTS, 500, 500) is None


def test_solver_actions_become_the_marks_modes_calls_or_none():
    assert mark_action({"tool": "click", "args": {"x": 40, "y": 100}}, ELEMENTS) == {
        "tool": "click_mark", "args": {"mark": 2}}
    assert mark_action({"tool": "write", "args": {"text": "Ada", "x": 90, "y": 148}}, ELEMENTS) == {
        "tool": "type_mark", "args": {"mark": 3, "text": "Ada"}}
    keys = {"tool": "press_keys", "args": {"keys": "Enter"}}
    assert mark_action(keys, ELEMENTS) == keys
    assert mark_action({"tool": "write", "args": {"text": "Ada"}}, ELEMENTS) is None  # the focused field: no mark
    assert mark_action({"tool": "drag", "args": {"x": 1, "y": 1, "to_x": 9, "to_y": 9}}, ELEMENTS) is None
    assert mark_action({"tool": "click", "args": {"x": 900, "y": 900}}, ELEMENTS) is None
