"""Session files that are damaged, of the wrong shape or from elsewhere: every truncation, wrong type, deleted field,
byte flip and arbitrary JSON value loads or raises SessionError (one line naming the file), never anything else."""
from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from session_support import assert_one_line_naming, make_session

from tinychat.sessions import session as S
from tinychat.sessions.session import SessionError


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TINYCHAT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


# -- corruption fuzzing --------------------------------------------------------------------------------------------
# Every corruption below must raise SessionError (any other exception fails the test) with a one-line message
# naming the file. Byte flips may leave a valid file (a flipped letter inside a message), so for them the
# property is "loads, or SessionError".

SID = "20240101-000000-000-abcdef"


@pytest.fixture
def valid_file(home) -> tuple[Path, bytes, dict]:
    s = make_session(2, sid=SID)
    path = S.save(s, touch=False)
    raw = path.read_bytes()
    return path, raw, json.loads(raw)


def expect_session_error(path: Path, content: bytes, label: str) -> str | None:
    """None when load raised a proper SessionError, else a description of what went wrong."""
    path.write_bytes(content)
    for target in (SID, path):
        try:
            S.load(target)
        except SessionError as e:
            message = str(e)
            if "\n" in message or str(path) not in message:
                return f"{label}: bad message {message!r}"
        except Exception as e:  # noqa: BLE001 - the point of the test
            return f"{label}: raised {type(e).__name__}: {e}"
        else:
            return f"{label}: loaded without error"
    return None


def dumps(d) -> bytes:
    return json.dumps(d).encode()


def test_every_truncation_raises_session_error(valid_file):
    path, raw, _ = valid_file
    rng = random.Random(1)
    body = len(raw.rstrip())
    cuts = sorted({0, 1, body - 1, *rng.sample(range(2, body - 1), 60)})
    failures = [f for n in cuts if (f := expect_session_error(path, raw[:n], f"cut at {n}"))]
    assert not failures, failures[:5]
    assert len(cuts) >= 60


WRONG_VALUES = {
    # field path -> values of the wrong type or out of range
    "id": [None, 7, "", "a.b", "../x", []],
    "title": [None, 3, ["t"]],
    "created": [None, "yesterday", -1, True, float("inf")],
    "updated": [None, {}, -0.5],
    "model": [None, "demo", [1]],
    "model.name": [None, 1],
    "model.hash": [None, ["ab"]],
    "tokenizer_hash": [None, 0],
    "quant": [None, 8],
    "device": [None, False],
    "settings": [None, [], "hot"],
    "messages": [None, {}, "hi"],
    "messages.0": [None, "hello", [1, 2]],
    "messages.1.role": [None, "robot", "User", 1],
    "messages.1.content": [None, 5, ["a"]],
    "messages.1.token_ids": [None, "1 2 3", {}],
    "messages.1.token_ids.2": [-1, 1.5, "7", None, True, 2**40],
    "messages.2.created": [None, "now", -3],
    "messages.2.settings": ["fast", [1], 0],
    "messages.2.seed": [-1, 1.5, "42", 2**64, True],
    "messages.2.finish": ["done", 1, True],
    "messages.2.timing_ms": ["fast", {}, [1, -2], [1, "x"], [None]],
}


def _parent(d, dotted: str):
    """('messages.1.role') -> (the messages[1] dict, 'role'); list indices become ints."""
    *parents, last = dotted.split(".")
    for key in parents:
        d = d[int(key)] if isinstance(d, list) else d[key]
    return d, int(last) if isinstance(d, list) else last


def _set(d, dotted: str, value):
    parent, key = _parent(d, dotted)
    parent[key] = value


def test_every_wrong_type_raises_session_error(valid_file):
    path, _, data = valid_file
    failures, n = [], 0
    for field_path, values in WRONG_VALUES.items():
        for value in values:
            d = copy.deepcopy(data)
            _set(d, field_path, value)
            n += 1
            # Python's json writes inf as 'Infinity': a non-standard constant the loader must refuse too.
            if failure := expect_session_error(path, dumps(d), f"{field_path}={value!r}"):
                failures.append(failure)
    assert not failures, failures[:5]
    assert n >= 70


def test_every_deleted_field_raises_session_error(valid_file):
    path, _, data = valid_file
    keys = [k for k in data if k not in S.OPTIONAL_FIELDS] + ["model.name", "model.hash"] + \
        [f"messages.2.{k}" for k in data["messages"][2]]
    failures = []
    for key in keys:
        d = copy.deepcopy(data)
        parent, last = _parent(d, key)
        del parent[last]
        if failure := expect_session_error(path, dumps(d), f"without {key}"):
            failures.append(failure)
    assert not failures, failures[:5]
    assert len(keys) >= 22


def test_foreign_and_future_files_raise_session_error(valid_file):
    path, _, data = valid_file
    foreign = [
        b"[]",
        b'"just a string"',
        b"null",
        b"42",
        dumps({**data, "schema": "otherapp.session"}),
        dumps({k: v for k, v in data.items() if k != "schema"}),
        dumps({**data, "version": 3}),
        dumps({**data, "version": "1"}),
        dumps({**data, "version": 1.0}),
        dumps({**data, "version": None}),
        b'{"schema": "tinychat.session", "version": 1}',
        b'{"name": "a VS Code settings file", "editor.fontSize": 14}',
        b"\xff\xfe" + "{}".encode("utf-16-le"),
        b"[" * 100_000 + b"]" * 100_000,  # absurd nesting
        b'{"schema": "tinychat.session", "version": ' + b"9" * 10_000 + b"}",  # absurd integer
        dumps(data).replace(b"0.7", b"NaN", 1),
        b"   \n\t ",
    ]
    failures = [f for i, c in enumerate(foreign) if (f := expect_session_error(path, c, f"foreign #{i}"))]
    assert not failures, failures[:5]


def test_random_byte_flips_load_or_raise_session_error_only(valid_file):
    path, raw, _ = valid_file
    rng = random.Random(7)
    raised = 0
    for trial in range(150):
        buf = bytearray(raw)
        for _ in range(rng.randint(1, 3)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        path.write_bytes(bytes(buf))
        try:
            S.load(path)
        except SessionError as e:
            assert_one_line_naming(e, path)
            raised += 1
    assert raised >= 50  # most flips break the JSON or a field; all others must still load


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_field_replaced_by_any_json_value_loads_or_raises_session_error(valid_file, data):
    path, _, valid = valid_file
    d = copy.deepcopy(valid)
    leaf_paths = list(_paths(d))
    target = data.draw(st.sampled_from(leaf_paths))
    _set(d, target, data.draw(json_values))
    path.write_bytes(dumps(d))
    try:
        S.load(path)
    except SessionError as e:
        assert_one_line_naming(e, path)


def _paths(d, prefix=""):
    items = d.items() if isinstance(d, dict) else enumerate(d)
    for k, v in items:
        p = f"{prefix}{k}"
        yield p
        if isinstance(v, (dict, list)) and v:
            yield from _paths(v, p + ".")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.binary(max_size=200))
def test_arbitrary_bytes_raise_session_error(home, content):
    path = home / "sessions" / f"{SID}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    with pytest.raises(SessionError) as err:
        S.load(SID)
    assert_one_line_naming(err.value, path)
