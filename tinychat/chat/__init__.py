"""The chat runtime: a conversation on one batch-1 KV cache, recorded to the token.

runtime.py   Chat, the facade: turns, restore, replay (what it owns: timeline, turns, store, branches)
timeline.py  the cache and how the active path got into it (the restore rule)
turns.py     a turn: TurnPlan, GenerateConfig, TurnResult, TurnRunner
store.py     save, lock, snapshot, the autosave's result
branches.py  alternatives, edits and forks of a chat's tree
branch_cache.py  caches of recently left branches, so switching back is cheap
ab.py        /ab: one prompt, two settings, side by side
quant_steps.py   which int8 step a turn runs on, by the name sessions record
replay.py    a session's turns decoded again and compared; replay_check.py: `replay --check`'s verdicts

`from tinychat.chat import Chat` loads the runtime (and torch) on first use only, so the torch-free modules here stay
cheap to import."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .runtime import Chat, ChatError, ChatSettings, model_identity

__all__ = ["Chat", "ChatError", "ChatSettings", "model_identity"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import runtime
        return getattr(runtime, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
