"""Issue #33 item 4: big session trees. Validating a tree walked each branch message up to the active path (a chain
of N messages hung off an early reply: N^2 steps; `tinychat sessions` took 111 s at 30,000 messages), and every
autosave re-validated and re-encoded the whole tree. Now validation is one walk down from the roots, and a save
encodes and checks only what changed (sessions/write.py, sessions/log.py).

The bounds here are on work, not time (unit tests assert no times): the lines of tinychat's Python a load, a listing
or a save executes (tests/work.py), which are the same on every machine. Growth from N to 8N messages must stay
linear (quadratic would be 64x), each call has a budget per message that stops a quadratic walk at once, and a save
after a turn runs the same lines whatever the tree's size. The times themselves: tests/perf/session_tree_bench.py,
tests/perf/tree_sessions.py and docs/benchmarks.md."""
import json
import os
import random

import pytest
from support import make_chat, tokenizer
from work import lines_run

from tinychat.sessions import session as S
from tinychat.sessions import check as session_check, read as session_read, write as session_write
from tinychat.sessions.check import tree_problem

SETTINGS = {"temperature": 0.8, "top_p": 0.9, "penalty": 1.2, "penalty_window": 64, "ban": True, "no_parrot": True,
            "ban_reply": True, "max_new": 64, "seed": 1}


def _msg(mid, parent, role, rng):
    ids = [rng.randrange(3, 390) for _ in range(6)]
    m = {"role": role, "content": "x", "token_ids": ids, "created": 1.0, "settings": None, "seed": None,
         "finish": None, "timing_ms": None, "id": mid, "parent": parent, "fork": None}
    if role == "assistant":
        m.update(settings=dict(SETTINGS), seed=rng.randrange(2 ** 62), finish="stop", timing_ms=[1.5] * 6)
    return m


def tree(n: int, shape: str, seed: int = 0, sid: str = "20261202-000000-000-abcdef") -> dict:
    """A session dict: system + two turns on the active path, and n branch messages: "deep", a chain off the first
    reply; "wide", alternatives of the first reply each with a continuation; "bushy", a random tree of turns."""
    rng = random.Random(seed)
    msgs = [_msg(1, None, "system", rng)] + [_msg(i, i - 1, r, rng) for i, r in
                                              zip(range(2, 6), ("user", "assistant", "user", "assistant"))]
    branches, nxt = [], 6
    if shape == "deep":
        parent = 3
        for i in range(n - n % 2):
            branches.append(_msg(nxt, parent, "user" if i % 2 == 0 else "assistant", rng))
            parent, nxt = nxt, nxt + 1
    elif shape == "wide":
        for _ in range(n // 3):
            branches += [_msg(nxt, 2, "assistant", rng), _msg(nxt + 1, nxt, "user", rng),
                         _msg(nxt + 2, nxt + 1, "assistant", rng)]
            nxt += 3
    else:                           # bushy: each new turn hangs off a random earlier reply
        replies = [3, 5]
        for _ in range(n // 2):
            at = rng.choice(replies)
            branches += [_msg(nxt, at, "user", rng), _msg(nxt + 1, nxt, "assistant", rng)]
            replies.append(nxt + 1)
            nxt += 2
    return {"schema": "tinychat.session", "version": 2, "id": sid, "title": "t", "created": 1.0, "updated": 1.0,
            "model": {"name": "tiny-test", "hash": ""}, "tokenizer_hash": "", "quant": "none", "device": "cpu",
            "settings": dict(SETTINGS), "messages": msgs, "branches": branches, "revision": 1, "kv_sha256": ""}


PER_MESSAGE = 400       # lines of tinychat per message, for a load or a listing + load + saves (about 60-175 now)


def _lines(fn, n: int) -> int:
    """The lines of tinychat fn executes, cut short (an AssertionError) past PER_MESSAGE x n."""
    return lines_run(fn, budget=PER_MESSAGE * n)[1]


@pytest.mark.parametrize("shape", ["deep", "wide", "bushy"])
def test_loading_a_tree_grows_linearly_with_its_size(tmp_path, shape):
    lines = {}
    for n in (1500, 12000):
        path = tmp_path / f"{n}.json"
        path.write_text(json.dumps(tree(n, shape)))
        lines[n] = _lines(lambda: S.load(path), n)
    assert lines[12000] / lines[1500] < 10, f"8x the messages ran {lines}: not linear"


def test_validating_a_deep_chain_is_linear():
    lines = {}
    for n in (2000, 16000):
        s = session_read._from_dict(tree(n, "deep"), "<test>")
        lines[n] = _lines(lambda: tree_problem(s.messages, s.branches), n)
    assert lines[16000] / lines[2000] < 10, lines


@pytest.mark.parametrize("shape", ["deep", "wide", "bushy"])
def test_a_20000_message_tree_lists_loads_and_saves_with_work_linear_in_its_size(tmp_path, shape):
    d = tree(20000, shape)
    path = tmp_path / f"{d['id']}.json"
    path.write_text(json.dumps(d))

    def list_load_save_turn_save():
        [info] = S.list_sessions(tmp_path)
        s = S.load(path)
        S.save(s, tmp_path)
        s.messages += [S.Message("user", "more", [1, 4, 2]),
                       S.Message("assistant", "ok", [1, 5, 2], settings=dict(SETTINGS), seed=2)]
        S.save(s, tmp_path)
        return info
    info = lines_run(list_load_save_turn_save, budget=PER_MESSAGE * 20000)[0]
    assert info.n_turns == 2 and S.load(path).n_turns == 3


@pytest.mark.parametrize("shape", ["deep", "wide", "bushy"])
def test_a_save_after_a_turn_runs_the_same_work_whatever_the_tree_s_size(tmp_path, shape):
    """Item 4's autosave goal, as work: once a big session is saved, a turn's save runs the same lines of tinychat at
    2,000 and at 20,000 messages (it appends the turn; the lists are compared in C, which this does not count)."""
    lines = {}
    for n in (2000, 20000):
        d = tree(n, shape)
        folder = tmp_path / str(n)
        folder.mkdir()
        path = folder / f"{d['id']}.json"
        path.write_text(json.dumps(d))
        s = S.load(path)
        S.save(s, folder)
        runs = []
        for k in range(3):
            s.messages += [S.Message("user", f"more {k}", [1, 4, 2]),
                           S.Message("assistant", "ok", [1, 5, 2], settings=dict(SETTINGS), seed=2)]
            runs.append(lines_run(lambda: S.save(s, folder), budget=PER_MESSAGE * 100)[1])
        lines[n] = max(runs)
        assert S.load(path).n_turns == 5
    assert lines[20000] <= lines[2000] + 100, lines


def test_a_save_after_a_turn_checks_and_encodes_only_the_new_messages(tmp_path, monkeypatch):
    d = tree(3000, "deep")
    path = tmp_path / f"{d['id']}.json"
    path.write_text(json.dumps(d))
    s = S.load(path)
    S.save(s, tmp_path)                                 # the first save encodes everything once
    calls = {"tree": 0, "messages": 0}

    def counting_tree(*a):
        calls["tree"] += 1
        return tree_problem(*a)

    real_fast = session_read._message_fast

    def counting_fast(*a):
        calls["messages"] += 1
        return real_fast(*a)

    monkeypatch.setattr(session_write, "tree_problem", counting_tree)
    monkeypatch.setattr(session_read, "_message_fast", counting_fast)
    s.messages += [S.Message("user", "more", [1, 4, 2]),
                   S.Message("assistant", "ok", [1, 5, 2], settings=dict(SETTINGS), seed=2)]
    S.save(s, tmp_path)
    assert calls["tree"] == 0                           # appended to the active path: no walk over the tree
    assert 0 < calls["messages"] <= session_write.CHUNK  # only the active path's chunk was encoded again
    s.branches.append(s.messages.pop())                 # the new reply made an alternative: the tree changed
    s.messages.append(S.Message("assistant", "other", [1, 6, 2], settings=dict(SETTINGS), seed=3))
    S.save(s, tmp_path)
    assert calls["tree"] == 1


def test_a_bad_appended_message_is_still_refused_before_it_is_written(tmp_path):
    d = tree(600, "wide")
    path = tmp_path / f"{d['id']}.json"
    path.write_text(json.dumps(d))
    s = S.load(path)
    before = path.read_bytes()
    s.messages.append(S.Message("user", "a user message without a reply", [1, 4, 2]))
    with pytest.raises(S.SessionError, match="without a reply"):
        S.save(s, tmp_path)
    s.messages.append(S.Message("assistant", "ok", [1, 5, 2], settings={"temperature": 9.0}, seed=2))
    with pytest.raises(S.SessionError, match="temperature must be between"):
        S.save(s, tmp_path)
    assert path.read_bytes() == before


def _fresh_bytes(session) -> bytes:
    """What a session object that never saved (no cached chunks) writes for the same tree."""
    import dataclasses
    copy = dataclasses.replace(session)
    return b"".join(S._serialize(copy, "<test>"))


def test_what_a_chat_saves_is_what_a_fresh_encoding_gives_after_every_kind_of_change(tmp_path, monkeypatch):
    monkeypatch.setattr(session_write, "CHUNK", 3)      # many small chunks: every change crosses some
    chat = make_chat(max_new=3, seed=3, sessions_dir=tmp_path)
    ops = [lambda: chat.send("hello there"), lambda: chat.send("why the cat?"), chat.regenerate,
           lambda: chat.switch_alternative("prev"), lambda: chat.send("and the dog"), chat.undo,
           lambda: chat.send("and the moon"), lambda: chat.switch_alternative("next", 4),
           lambda: chat.edit_reply(None, "written by hand"), lambda: chat.send("more"), chat.regenerate,
           lambda: chat.fork(0, tokenizer().im_end)]
    for i, op in enumerate(ops):
        op()
        path = chat.save()
        assert path.read_bytes() == _fresh_bytes(chat.session), f"after op {i}"
        assert S.load(path).messages == chat.session.messages


def test_a_cycle_and_an_unreached_tail_are_named(tmp_path):
    d = tree(40, "deep")
    d["branches"][10]["parent"] = d["branches"][20]["id"]      # 10..20 now loop; 21.. hang from the loop
    with pytest.raises(S.SessionError, match="cycle"):
        session_read._from_dict(d, "<test>")
    assert session_check.tree_problem([], []) is None


def test_damaged_big_trees_load_or_refuse_in_one_line_with_linear_work(tmp_path):
    """The fuzz of issue #33 for trees: random damage (parent links to random ids, cycles, roles, settings, seeds) to
    deep, wide and bushy trees of thousands of messages; each load is one line or a session, its work linear in the
    tree (a budget of lines per message: a walk from each message up to the path would spend it at once)."""
    rng = random.Random(33)
    base = {shape: tree(2000, shape, seed=i) for i, shape in enumerate(("deep", "wide", "bushy"))}
    outcomes = {"loaded": 0, "refused": 0}
    for n in range(30):
        d = json.loads(json.dumps(base[rng.choice(sorted(base))]))
        msgs = d["branches"]
        for _ in range(rng.randint(1, 3)):
            m = rng.choice(msgs)
            kind = rng.randrange(5)
            if kind == 0:
                m["parent"] = rng.choice(msgs)["id"]                  # may close a loop
            elif kind == 1:
                m["role"] = rng.choice(["user", "assistant", "system"])
            elif kind == 2:
                m["settings"] = None
            elif kind == 3:
                m["seed"] = None
            else:
                m["parent"] = 10 ** 9
        path = tmp_path / f"{d['id']}.json"
        path.write_text(json.dumps(d))
        try:
            _lines(lambda: S.load(path), 2000)
            outcomes["loaded"] += 1
        except S.SessionError as e:
            assert "\n" not in str(e) and str(path) in str(e), str(e)
            outcomes["refused"] += 1
    assert outcomes["refused"] > 10


def test_listing_parses_only_files_changed_since_they_were_saved_or_listed(tmp_path, monkeypatch):
    from tinychat.sessions import index as session_index
    monkeypatch.setattr(S, "LOG_MIN_MESSAGES", 10 ** 9)     # one JSON document (a log's listing: test_session_log)
    d = tree(3000, "deep")
    path = tmp_path / f"{d['id']}.json"
    path.write_text(json.dumps(d))
    s = S.load(path)
    S.save(s, tmp_path)
    parsed = []
    real = session_read._read_json
    monkeypatch.setattr(session_read, "_read_json", lambda p: parsed.append(p) or real(p))
    [info] = S.list_sessions(tmp_path)
    assert parsed == [] and info.n_turns == 2               # the save's row: no parse of 3,000 messages
    damaged = path.read_text().replace('"role": "user"', '"role": "usr"', 1)
    path.write_text(damaged)                                 # edited in place: another mtime / ctime
    os.utime(path, ns=(1, 1))
    errors: list = []
    assert S.list_sessions(tmp_path, errors) == [] and len(parsed) == 1 and "role" in str(errors[0])
    assert S.list_sessions(tmp_path, errors) == [] and len(parsed) == 1     # its error remembered too
    session_index.index_path(tmp_path).write_text("{not json")               # a damaged index: parse again
    assert S.list_sessions(tmp_path) == [] and len(parsed) == 2
