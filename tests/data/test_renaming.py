from orchard.data.renaming import rename, renamed_copy
from orchard.data.trajectory import Message, ToolCall, Trajectory


def test_rename_replaces_whole_names_in_one_pass():
    text = "def fold_kovel(zantri, kovels):  # kovelish, Kovel, zantrikovel, tests/test_kovels.py::test_fold_kovel"
    swapped = {"kovel": "zantri", "zantri": "kovel"}
    assert rename(text, swapped) == ("def fold_zantri(kovel, zantris):  # kovelish, Kovel, zantrikovel, "
                                     "tests/test_zantris.py::test_fold_zantri")  # whole words, never renamed twice
    assert rename(text, {}) == text
    assert rename(r'{"body": "Hi Kovel,\n\nKovel\tkovel"}', {"Kovel": "Zantri"}) == (
        r'{"body": "Hi Zantri,\n\nZantri\tkovel"}')  # after a JSON string's escapes


def test_a_renamed_copy_renames_every_message_and_forgets_what_was_sampled():
    run = Trajectory(task_id="t-1", messages=[
        Message(role="user", content="Write to Bako Lumira about Zorvak."),
        Message(role="assistant", content="Looking Bako up.", reasoning="Bako, then mail",
                tool_calls=[ToolCall(name="mail_send", arguments={"to": ["bako.lumira@x.org"], "subject": "Zorvak",
                                                                  "draft": {"body": "Hi Bako", "count": 2}})],
                token_ids=[1, 2], logprobs=[-0.1, -0.2], weight_version=3),
        Message(role="tool", content='{"sent": "Zorvak"}', tool_call_id="c1")])
    mapping = {"Bako": "Tepu", "bako": "tepu", "Zorvak": "Milo"}
    copy = renamed_copy(run, mapping, 2)
    assert copy.id == f"{run.id}-renamed2" and copy.task_id == run.task_id
    user, assistant, tool = copy.messages
    assert user.content == "Write to Tepu Lumira about Milo."
    assert assistant.content == "Looking Tepu up." and assistant.reasoning == "Tepu, then mail"
    assert assistant.tool_calls[0].arguments == {"to": ["tepu.lumira@x.org"], "subject": "Milo",
                                                 "draft": {"body": "Hi Tepu", "count": 2}}
    assert (assistant.token_ids, assistant.logprobs, assistant.weight_version) == (None, None, None)
    assert tool.content == '{"sent": "Milo"}' and tool.tool_call_id == "c1"
    assert run.messages[1].token_ids == [1, 2]  # the original is left as it was
