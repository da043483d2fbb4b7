"""The line under a finished reply says only what was measured: no rate without two tokens, no TTFT without one."""
from types import SimpleNamespace

from tinychat.tui.stream import turn_meta


def _result(n, finish="stop", tok_s=31.6, ttft=120.4):
    return SimpleNamespace(token_ids=list(range(n)), n_tokens=n, finish=finish, decode_tok_s=tok_s, ttft_ms=ttft,
                           stats=SimpleNamespace(banned_steps=0, lifts=0), dropped_turns=0)


def test_a_finished_reply_shows_its_rate_and_ttft():
    assert turn_meta(_result(12)) == "12 tokens · 32 tok/s · TTFT 120 ms"


def test_a_reply_stopped_before_its_first_token_shows_no_rate():
    assert turn_meta(_result(0, "cancelled", tok_s=0.0, ttft=0.0)) == "0 tokens · stopped before the first token"


def test_a_one_token_reply_has_a_ttft_but_no_rate():
    assert turn_meta(_result(1, tok_s=0.0)) == "1 token · TTFT 120 ms"
