"""Naming a saved session by the start of its id: unique starts resolve, ambiguous ones say so, exact ids win."""
from __future__ import annotations

import pytest

from tinychat.sessions import session as S
from tinychat.sessions.session import Message, Session, SessionError


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYCHAT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _saved(sid: str, title: str) -> Session:
    s = Session(id=sid, created=1_700_000_000.0, updated=1_700_000_001.0, model={"name": "demo", "hash": "ab" * 32},
                tokenizer_hash="cd" * 32, quant="none", device="cpu", settings={}, title=title)
    s.messages.append(Message("user", title, [1, 12, 2, 5], created=1_700_000_000.5))
    s.messages.append(Message("assistant", "ok", [1, 14, 2, 5], created=1_700_000_000.7, settings={}, seed=1,
                              finish="stop"))
    S.save(s, touch=False)
    return s


def test_the_unique_start_of_an_id_loads_that_session():
    _saved("20261202-023742-582-d2fc28", "moon")
    _saved("20261202-040000-001-aaaaaa", "sun")
    assert S.load("20261202-0237").title == "moon"
    assert S.load("20261202-04").title == "sun"
    assert S.resolve_id("20261202-0237") == "20261202-023742-582-d2fc28"


def test_an_ambiguous_start_names_the_count_and_the_candidates():
    for sid in ("20261202-023742-582-d2fc28", "20261202-023750-000-bbbbbb", "20261202-023755-000-cccccc",
                "20261202-023759-000-dddddd"):
        _saved(sid, sid[-6:])
    with pytest.raises(SessionError, match="ambiguous: 4 saved sessions start so") as err:
        S.load("20261202-0237")
    assert "20261202-023742-582-d2fc28" in str(err.value) and "..." in str(err.value)
    assert "\n" not in str(err.value)


def test_an_exact_id_wins_over_longer_ids_that_start_with_it():
    _saved("abc", "short")
    _saved("abcdef", "long")
    assert S.load("abc").title == "short"
    assert S.resolve_id("abcd") == "abcdef"


def test_no_match_names_the_file_and_how_to_list_sessions(home):
    _saved("20261202-023742-582-d2fc28", "moon")
    with pytest.raises(SessionError, match="no such session file") as err:
        S.load("nope")
    assert str(home / "sessions" / "nope.json") in str(err.value) and "tinychat sessions" in str(err.value)


def test_delete_by_a_unique_start_removes_that_session_only():
    _saved("20261202-023742-582-d2fc28", "moon")
    _saved("20261202-040000-001-aaaaaa", "sun")
    assert S.delete("20261202-0237")
    assert [i.id for i in S.list_sessions()] == ["20261202-040000-001-aaaaaa"]
    with pytest.raises(SessionError, match="ambiguous"):
        _saved("20261202-040500-001-bbbbbb", "rain")
        S.delete("20261202-04")
    assert len(S.list_sessions()) == 2
