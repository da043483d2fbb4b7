"""Replay: regenerate each turn with its recorded settings and seed; report the first differing token."""
import threading

from support import make_chat
from tinychat import session as S
from tinychat.replay import replay


def _recorded(turns=3, **kw):
    chat = make_chat(max_new=14, seed=21, **kw)
    for q in ["hello there, tell me a story", "why the cat?", "and the dog?"][:turns]:
        chat.send(q)
    return S.load(chat.session.id)


def test_untouched_session_replays_token_exact():
    sess = _recorded()
    report = replay(make_chat(autosave=False), sess)
    assert report.ok and len(report.turns) == 3
    assert report.n_tokens == sum(len(t.recorded) for t in report.turns) > 20
    assert all(t.tokens == t.recorded for t in report.turns)


def test_replay_reports_a_tampered_token_with_both_probabilities():
    sess = _recorded()
    reply = sess.messages[4]                                   # the second assistant turn
    n_head = len(make_chat().tok.generation_prompt_ids())
    original = reply.token_ids[n_head + 3]
    reply.token_ids[n_head + 3] = (original + 1) % 300
    report = replay(make_chat(autosave=False), sess)
    assert not report.ok
    d = report.divergences[0]
    assert (d.turn, d.position, d.recorded, d.replayed) == (2, 3, (original + 1) % 300, original)
    assert d.p_replayed is not None and d.p_recorded is not None and d.p_replayed > 0
    assert report.turns[0].divergence is None
    assert "turn 2, token 3" in d.describe()


def test_cancelled_turn_replays_the_sampled_prefix():
    chat = make_chat(max_new=100, seed=5)

    def on_token(i, t, text, tr, ms):
        if i == 6:
            threading.Thread(target=chat.cancel).start()

    chat.send("tell me a long story", on_token=on_token)
    chat.send("and then?")
    sess = S.load(chat.session.id)
    assert sess.messages[2].finish == "cancelled"
    assert replay(make_chat(autosave=False), sess).ok


def test_replay_of_a_session_whose_context_was_shortened_is_exact():
    chat = make_chat(max_new=24, seed=3, max_len=150)
    for w in ("cat", "dog", "moon", "sun"):
        chat.send(f"tell me about the {w} and the river")
    sess = S.load(chat.session.id)
    assert any((m.settings or {}).get("context_start") for m in sess.messages if m.role == "assistant")
    assert replay(make_chat(autosave=False, max_len=150), sess).ok


def test_turns_recorded_before_the_reply_ban_existed_replay_without_it():
    chat = make_chat(max_new=40, seed=4, ban_reply=False, temperature=0.0)
    for q in ["hello there, tell me a story", "why the cat?"]:
        chat.send(q)
    sess = S.load(chat.session.id)
    for m in sess.messages:
        if m.settings:
            m.settings.pop("ban_reply")                   # as an older tinychat wrote them
    report = replay(make_chat(autosave=False), sess)     # today's default has the reply ban on
    assert report.ok and report.n_tokens > 20
    # the same turns with the reply ban on would have differed: the setting matters on this model
    again = make_chat(max_new=40, seed=4, ban_reply=True, temperature=0.0, autosave=False)
    assert [again.send(q).text for q in ["hello there, tell me a story", "why the cat?"]] != \
        [m.content for m in sess.messages if m.role == "assistant"]


def test_replay_uses_only_the_public_chat_api():
    """replay.py drives a Chat through start_replay / replay_turn / settings, never its private members."""
    import ast
    import inspect

    import tinychat.replay as R
    tree = ast.parse(inspect.getsource(R))
    private = sorted({n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                      and isinstance(n.value, ast.Name) and n.value.id == "chat" and n.attr.startswith("_")})
    assert private == []
