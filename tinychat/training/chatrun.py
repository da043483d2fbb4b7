"""Chat held-out or probe conversations through the real runtime (a fresh Chat each, no autosave)."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence


def chat_conversations(model, tok, conversations: Sequence[Sequence[dict]], max_new: int = 192, seed: int = 0,
                       max_turns: int = 4, model_name: str = "eval", log=None, settings=None) -> list[dict]:
    """Send each conversation's user messages through a fresh Chat (`settings`, default the app's defaults, with
    max_new and a per-turn seed). Returns [{"turns": [{"user", "reply", "finish", "tokens"}...]}, ...]."""
    from tinychat.chat.runtime import Chat, ChatSettings, model_identity

    ident = model_identity(model)
    out = []
    for ci, msgs in enumerate(conversations):
        users = [m["content"] for m in msgs if m["role"] == "user"][:max_turns]
        chat = Chat(model, tok, dataclasses.replace(settings or ChatSettings(), max_new=max_new), autosave=False,
                    model_name=model_name, model_hash=ident)
        turns = []
        for ti, u in enumerate(users):
            chat.settings = dataclasses.replace(chat.settings, seed=seed * 1_000_003 + ci * 101 + ti)
            r = chat.send(u)
            turns.append({"user": u, "reply": r.text, "finish": r.finish, "tokens": r.n_tokens})
        out.append({"turns": turns})
        if log:
            log(f"  conversation {ci + 1}/{len(conversations)}: {len(turns)} turns, "
                f"{sum(t['finish'] == 'stop' for t in turns)} stopped")
    return out
