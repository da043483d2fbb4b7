"""Issue #33 item 10: `replay --check` regenerated from the token ids and ignored the text, so a reply whose content
was edited to "Cats are reptiles... TAMPERED" still replayed "token-exact" (exit 0) while `sessions show`, export and
--grep showed the edited text. Each message's text must be what its token ids hold: replay reports a turn whose text
is not (not token-exact: exit 1), a chat refuses to continue such a session, and a reply whose ids lack the chat
frame is refused by both."""
import json

import pytest
from support import make_chat, run_main

from tinychat.sessions import session as S
from tinychat.chat.runtime import Chat
from tinychat.chat.replay import replay, replay_tree
from tinychat.sessions.check import text_problem


def _recorded(tmp_path=None):
    chat = make_chat(max_new=6, seed=3)
    chat.send("tell me about cats")
    chat.send("and dogs?")
    chat.set("seed", "9")
    chat.regenerate()
    chat.close()
    return chat.session.id, S.session_path(chat.session.id)


def _edit(path, where, **fields):
    d = json.loads(path.read_text())
    (d[where[0]][where[1]]).update(fields)
    path.write_text(json.dumps(d))


def test_a_reply_whose_text_was_edited_does_not_replay_token_exact(capsys, monkeypatch, model_folder):
    sid, path = _recorded()
    _edit(path, ("messages", 2), content="Cats are reptiles that live on the moon. TAMPERED")
    code, out, err = run_main(["replay", sid, "--check", "--model", model_folder], capsys)
    assert code == 1, out + err
    assert "turn 1: the reply's text is not what its recorded tokens decode to" in out
    assert "token-exact" not in out


def test_an_edited_reply_on_another_branch_is_named_with_its_branch(capsys, model_folder):
    sid, path = _recorded()
    _edit(path, ("branches", 0), content="TAMPERED")
    code, out, _ = run_main(["replay", sid, "--check", "--model", model_folder], capsys)
    assert code == 1 and "branch turn 2 reply 1/2: turn 2: the reply's text is not" in out
    code, out, _ = run_main(["replay", str(path.parent), "--check", "--json", "--model", model_folder], capsys)
    rows = [json.loads(x) for x in out.splitlines()]
    [row] = [r for r in rows if r["session"] == sid]
    assert code == 1 and row["ok"] is False and "TAMPERED" not in row["text"] and "text is not" in row["text"]


def test_a_user_message_whose_text_was_edited_is_reported_too():
    sid, path = _recorded()
    _edit(path, ("messages", 3), content="something I never said")
    [branch, *_] = replay_tree(make_chat(autosave=False), S.load(sid))
    assert not branch.report.ok
    assert branch.report.text_problems == ["turn 2: the user message's text is not what its recorded tokens hold "
                                           "(edited by hand?)"]


def test_continuing_a_session_whose_text_and_tokens_disagree_is_refused_in_one_line():
    sid, path = _recorded()
    _edit(path, ("messages", 4), content="TAMPERED")
    chat = make_chat(autosave=False)
    with pytest.raises(S.SessionError) as e:
        Chat.restore(sid, chat.model, chat.tok, max_len=512, autosave=False)
    assert "messages[4]: its text is not what its token ids hold" in str(e.value) and "\n" not in str(e.value)


def test_a_reply_without_the_chat_frame_is_refused_by_replay_and_restore():
    sid, path = _recorded()
    d = json.loads(path.read_text())
    d["messages"][2]["token_ids"] = d["messages"][2]["token_ids"][3:]      # the assistant header cut off
    path.write_text(json.dumps(d))
    chat = make_chat(autosave=False)
    for run in (lambda: replay(chat, S.load(sid)),
                lambda: Chat.restore(sid, chat.model, chat.tok, max_len=512, autosave=False)):
        with pytest.raises(S.SessionError, match="a reply whose token ids lack the chat frame"):
            run()


def test_a_reply_written_by_hand_through_the_chat_is_consistent():
    chat = make_chat(max_new=6, seed=3)
    chat.send("tell me about cats")
    chat.edit_reply(None, "Cats are mammals, written by hand.")
    s = chat.session
    assert text_problem(s.messages, chat.tok) is None and text_problem(s.branches, chat.tok) is None
    assert replay(make_chat(autosave=False), S.load(s.id)).ok


@pytest.fixture
def model_folder(tmp_path_factory):
    from support import make_chat_model, tokenizer
    d = tmp_path_factory.mktemp("model")
    make_chat_model().save_pretrained(d)
    tokenizer().save(d / "tokenizer.json")
    return d
