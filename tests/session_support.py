"""A session with every kind of field for the session file tests, and the one-line error check."""
from __future__ import annotations

from pathlib import Path


from tinychat.sessions import session as S
from tinychat.sessions.session import Message, Session, SessionError


def make_session(n_turns: int = 2, sid: str | None = None) -> Session:
    s = Session(
        id=sid or S.new_id(),
        created=1_700_000_000.5,
        updated=1_700_000_100.25,
        model={"name": "demo", "hash": "ab" * 32, "quant_note": "extra keys survive"},
        tokenizer_hash="cd" * 32,
        quant="int8",
        device="cuda",
        settings={"temperature": 0.7, "top_p": 0.9, "ban_phrases": True, "stop": ["x"]},
    )
    s.messages.append(Message("system", "Be brief.", [1, 10, 11, 2, 5], created=1_700_000_000.5))
    for t in range(n_turns):
        question = f"question {t}: naïve 😀\nline two"
        s.messages.append(Message("user", question, [1, 12, 13 + t, 2, 5], created=1_700_000_001.0 + t))
        s.messages.append(
            Message(
                "assistant",
                f"answer {t}",
                [1, 14, 20 + t, 21, 2, 5],
                created=1_700_000_002.0 + t,
                settings={"temperature": 0.7, "top_p": 0.9},
                seed=2**63 - 1 - t,  # seeds are 0..2^63-1, as the --seed flag takes
                finish="stop" if t % 2 == 0 else "length",
                timing_ms=[12.5, 3.25, 3.0],
            )
        )
    return s


def assert_one_line_naming(err: SessionError, path: Path) -> None:
    message = str(err)
    assert "\n" not in message and "\r" not in message, message
    assert str(path) in message, message
