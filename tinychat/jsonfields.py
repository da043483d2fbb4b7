"""Typed reading of untrusted JSON objects (session files, sessions/check.py): every check names the field by its
JSON path (`messages[3].token_ids[17]`) in a one-line error of the caller's exception type, and shows a bad value
the same short way everywhere. No tinychat imports, no torch."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


def one_line(text: object) -> str:
    return " ".join(str(text).split())


def jtype(v: Any) -> str:
    """A JSON value's type in words: 'an object', 'an array', 'null', ..."""
    names = {
        dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer", float: "a number"
    }
    return "null" if v is None else names.get(type(v), type(v).__name__)


def show(v: Any) -> str:
    """A value for an error message: containers by type, the rest by repr (escapes newlines: one line) cut to 40."""
    if isinstance(v, (dict, list)):
        return jtype(v)
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_time(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def is_str(v: Any) -> bool:
    return isinstance(v, str)


def is_obj(v: Any) -> bool:
    return isinstance(v, dict)


class Fields:
    """Typed access to one JSON object's fields; a failure raises `error` naming the file (`where`) and the field
    (`prefix` + key). `defaults`: the values of optional fields (added after a format shipped) when absent."""

    def __init__(self, data: dict, where: str, prefix: str = "", error: type[Exception] = ValueError,
                 defaults: dict[str, Any] | None = None):
        self.data, self.where, self.prefix, self.error = data, where, prefix, error
        self.defaults = defaults or {}

    def at(self, data: dict, prefix: str) -> Fields:
        """The same reader on a nested object."""
        return Fields(data, self.where, prefix, self.error, self.defaults)

    def fail(self, key: str, what: str) -> Exception:
        return self.error(f"{self.where}: field {self.prefix}{key} {what}")

    def get(self, key: str, ok: Callable[[Any], bool], expected: str, *, nullable: bool = False) -> Any:
        if key not in self.data:
            raise self.error(f"{self.where}: missing field {self.prefix}{key}")
        value = self.data[key]
        if value is None and nullable:
            return None
        if not ok(value):
            raise self.fail(key, f"must be {expected}{' or null' if nullable else ''}, got {show(value)}")
        return value

    def optional(self, key: str, ok: Callable[[Any], bool], expected: str) -> Any:
        """A field added after the format shipped: its default when absent."""
        if key not in self.data:
            return self.defaults[key]
        return self.get(key, ok, expected)

    def int_list(self, key: str, ok: Callable[[Any], bool], expected: str, *, nullable: bool = False) -> list | None:
        values = self.get(key, lambda v: isinstance(v, list), "an array", nullable=nullable)
        if values is not None and not all(map(ok, values)):
            i = next(i for i, v in enumerate(values) if not ok(v))
            raise self.fail(f"{key}[{i}]", f"must be {expected}, got {show(values[i])}")
        return values
