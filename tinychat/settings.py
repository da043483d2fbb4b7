"""Chat settings: what shapes each turn's sampling. Torch-free, so the CLI can validate flags before the app or the
engine is imported."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .numbers import parse_float, parse_int
from .errors import TinychatError


class ChatError(TinychatError, ValueError):
    """A turn or setting the chat cannot take; one line, fit for the user."""


class OtherModel(ChatError):
    """A session recorded with another model (or another version of this one) than the chat's: what the app needs to
    offer that model instead (the recorded name; "default": the shipped model)."""

    def __init__(self, message: str, session_id: str = "", model_name: str = "", same_name: bool = False):
        super().__init__(message)
        self.session_id, self.model_name, self.same_name = session_id, model_name, same_name


# What the sampler's dead-end guard (sampler.TurnHook: the ban would leave under 5 % of the mass) lifts, recorded with
# each turn (its settings' "dead_end") so that replay samples an old turn as it ran:
# KEEP_REPLY (turns from this version on): only the bans from earlier turns and the user's message (no-parrot); the
#   3-grams the reply itself already said stay banned, so a reply never repeats one (it cannot loop). The draw then
#   takes the best of what is left, however little mass that is; where nothing at all is left (every other logit
#   -inf) the reply ends there (the stop token).
# LIFT_ALL (turns recorded without the key): every ban, the reply's own too, which let a low-temperature reply loop
#   ("la Rivière de la Rivière, la Rivière de la Riv", 29 lifts in 60 tokens).
KEEP_REPLY = "keep-reply"
LIFT_ALL = "lift-all"
DEAD_END_RULES = (KEEP_REPLY, LIFT_ALL)


@dataclass(frozen=True)
class ChatSettings:
    """Sampler and turn settings. Changes apply from the next turn and are recorded with it."""
    system_prompt: str = "You are a helpful assistant."
    # The shipped model's defaults, measured on held-out chats and the probe (docs/benchmarks.md, "Sampler defaults
    # for the shipped model"): a penalty over the user's words and no-parrot kept it from naming what was asked
    # ("Tell me the capital of Japan." -> "The capital of Italy ...": "capital of Japan" was banned).
    temperature: float = 0.8
    top_p: float = 0.9
    penalty: float = 1.0            # repetition penalty (1.0: off; it counts the user's words too)
    penalty_window: int = 64        # over the last this-many content tokens of the conversation
    ban: bool = True                # phrase ban: 3-grams the assistant already said in earlier turns
    no_parrot: bool = False         # ... and the 3-grams of the user's current message
    ban_reply: bool = True          # ... and the 3-grams this reply already said (no loops within a reply)
    max_new: int = 256
    seed: int | None = None         # None: a fresh random seed per turn (recorded)

    LIMITS = {"temperature": (0.0, 5.0), "top_p": (0.01, 1.0), "penalty": (1.0, 5.0), "penalty_window": (0, 100000),
              "max_new": (1, 100000)}

    def __post_init__(self):
        for k, (lo, hi) in self.LIMITS.items():
            v = getattr(self, k)
            if not lo <= v <= hi:
                raise ChatError(f"{k.replace('_', '-')} must be between {lo:g} and {hi:g} (got {v})")
        if self.seed is not None and not 0 <= self.seed < 2 ** 63:
            raise ChatError("seed must be a non-negative integer below 2^63")

    def sampler(self) -> dict:
        """The per-turn record of what shaped this turn's sampling."""
        d = dataclasses.asdict(self)
        d.pop("system_prompt")
        return d

    @staticmethod
    def field_name(key: str) -> str:
        """The field a `/set` key names (max-new -> max_new, system -> system_prompt)."""
        key = key.replace("-", "_").lower()
        return "system_prompt" if key == "system" else key

    def with_value(self, key: str, value: str) -> "ChatSettings":
        """A copy with one setting parsed from text (`/set KEY VALUE`)."""
        key = self.field_name(key)
        fields = {f.name: f for f in dataclasses.fields(self)}
        if key not in fields:
            raise ChatError(f"unknown setting {key!r} (settings: {', '.join(n.replace('_', '-') for n in fields)})")
        cur = getattr(self, key)
        try:
            if key == "seed":
                v = None if value.strip().lower() in ("", "none", "random", "off") else parse_int(value)
            elif isinstance(cur, bool):
                low = value.strip().lower()
                if low not in ("on", "off", "true", "false", "1", "0", "yes", "no"):
                    raise ValueError
                v = low in ("on", "true", "1", "yes")
            elif isinstance(cur, int):
                v = parse_int(value)
            elif isinstance(cur, float):
                v = parse_float(value)
            else:
                v = value
        except ValueError:
            kind = "int" if key == "seed" else type(cur).__name__
            raise ChatError(f"{key.replace('_', '-')}: cannot read {value!r} as {kind} (digits 0-9)") from None
        return dataclasses.replace(self, **{key: v})
