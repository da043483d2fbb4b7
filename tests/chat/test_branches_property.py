"""Property: any sequence of turns, regenerations, edits, forks, switches and undos leaves a session that saves, loads and
replays exactly (every branch), and a cache bit-identical to a fresh restore of the active path."""
import dataclasses
import tempfile

import torch
from hypothesis import given, settings, strategies as st
from support import make_chat, make_chat_model, tokenizer

from tinychat.sessions import session as S
from tinychat.chat.runtime import Chat, ChatError
from tinychat.chat.replay import replay_tree

_MODEL = make_chat_model()

_OPS = st.lists(st.one_of(
    st.tuples(st.just("send"), st.sampled_from(["hello there", "why the cat?", "and the dog", "ok"])),
    st.tuples(st.just("regen"), st.integers(0, 50)),
    st.tuples(st.just("alt"), st.sampled_from(["next", "prev", "1", "2", "3"])),
    st.tuples(st.just("alt_earlier"), st.sampled_from(["next", "1"])),
    st.tuples(st.just("undo"), st.just(None)),
    st.tuples(st.just("edit"), st.sampled_from(["first", "last"])),
    st.tuples(st.just("fork"), st.tuples(st.integers(0, 8), st.sampled_from([5, 17, 40, 123, 301, tokenizer().im_end]),
                                         st.booleans())),
), min_size=1, max_size=10)


def _first_reply(chat) -> int:
    return 2 if chat.session.messages and chat.session.messages[0].role == "system" else 1


def _ring_free(sd: dict) -> dict:
    return {k: (v[..., :-1, :] if k in ("lk", "lv") else v) for k, v in sd.items()}


@settings(max_examples=40, deadline=None)
@given(ops=_OPS)
def test_random_trees_save_load_and_replay_exactly(ops):
    with tempfile.TemporaryDirectory() as d:
        chat = make_chat(_MODEL, max_new=6, seed=1, sessions_dir=d)
        for op, arg in [("send", "hello there"), *ops]:     # a first turn: most ops need a reply
            try:
                if op == "send":
                    chat.send(arg)
                elif op == "regen":
                    chat.set("seed", str(arg))
                    chat.regenerate()
                elif op == "alt":
                    chat.switch_alternative(arg)
                elif op == "alt_earlier":
                    chat.switch_alternative(arg, index=_first_reply(chat))
                elif op == "fork":              # the last reply, or the first turn's (its later turns move off)
                    pos, token, earlier = arg
                    chat.fork(pos, token, index=_first_reply(chat) if earlier else None)
                elif op == "edit":
                    users = [i for i, m in enumerate(chat.session.messages) if m.role == "user"]
                    if users:
                        chat.edit(users[0] if arg == "first" else users[-1], f"edited {arg}")
                else:
                    chat.undo()
            except ChatError:               # nothing to regenerate / switch / undo yet, a number out of range
                pass
        if chat.session.n_turns == 0:
            return
        chat.save()
        chat.close()
        loaded = S.load(chat.session.id, d)
        tree = lambda s: sorted((m.id, m.parent, m.role, tuple(m.token_ids), str(m.fork))  # noqa: E731
                                for m in s.messages + s.branches)
        assert tree(loaded) == tree(chat.session)
        assert [m.id for m in loaded.messages] == [m.id for m in chat.session.messages]
        fresh = Chat.restore(dataclasses.replace(loaded, branches=[]), _MODEL, tokenizer(), use_snapshot=False,
                             autosave=False, max_len=512)
        a, b = _ring_free(chat.cache.state_dict()), _ring_free(fresh.cache.state_dict())
        assert all(torch.equal(a[k], b[k]) for k in a)
        rp = make_chat(_MODEL, autosave=False)
        results = replay_tree(rp, loaded)
        assert len(results) == 1 + sum(1 for m in loaded.branches if not any(x.parent == m.id for x in
                                                                              loaded.messages + loaded.branches))
        assert all(r.report.ok for r in results), [(r.label, r.report.divergences) for r in results]
