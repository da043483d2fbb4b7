"""Fuzz: damaged session files and snapshots, through everything that reads them (load, continue, show, replay).

A seeded loop (CASES cases, the same every run) damages a real 3-turn session: a field set to a value of another
type, messages inserted / dropped / re-roled, token ids outside the vocabulary, settings of the wrong type,
truncated or byte-flipped JSON, byte-flipped / truncated / foreign / missing snapshots. The properties:
- load, continue and replay either work or raise SessionError / ChatError with one line (never another exception,
  never a crash: token ids are checked before any kernel sees them);
- a continued chat's cache is always the one the token ids give (a damaged snapshot never changes the conversation);
- what `sessions show` prints holds no control character but newlines and tabs.
"""
import copy
import json
import random

import torch
from support import make_chat, make_chat_model, tokenizer

from tinychat.sessions import session as S
from tinychat.sessions import export as SE
from tinychat.chat.runtime import Chat, ChatError
from tinychat.chat.replay import replay
from tinychat.textsafe import safe_text

CASES = 300                 # all of them every run: a fixed count, not as many as fit in some seconds

POOL = [None, True, False, 0, -1, 1.5, 10.5, 64.5, 2**63, 2**64, 399, 400, 9000, 100000, "", "no", "abc",
        "\x1b]0;x\x07", [], {}, [1, 2], {"a": 1}, 1e308]
SETTING_KEYS = ["temperature", "top_p", "penalty", "penalty_window", "ban", "no_parrot", "max_new", "seed",
                "context_start", "step"]


def _leaves(d, prefix=()):
    items = d.items() if isinstance(d, dict) else enumerate(d)
    for k, v in items:
        yield (*prefix, k)
        if isinstance(v, (dict, list)) and v:
            yield from _leaves(v, (*prefix, k))


def _set(d, path, value):
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value


def _mutate_json(rng, data, vocab):
    d = copy.deepcopy(data)
    msgs = d["messages"]
    kind = rng.randrange(7)
    if kind == 0:
        _set(d, rng.choice(list(_leaves(d))), rng.choice(POOL))
    elif kind == 1:
        msgs.insert(rng.randrange(len(msgs) + 1), copy.deepcopy(rng.choice(msgs)))
    elif kind == 2:
        del msgs[rng.randrange(len(msgs))]
    elif kind == 3:
        rng.choice(msgs)["role"] = rng.choice(["system", "user", "assistant"])
    elif kind == 4:
        m = rng.choice(msgs)
        if m["token_ids"]:
            m["token_ids"][rng.randrange(len(m["token_ids"]))] = rng.choice(
                [rng.randrange(vocab), vocab, vocab + rng.randrange(10**6), 2**31 - 1])
    elif kind == 5:
        target = d["settings"] if rng.random() < 0.3 else (rng.choice([m for m in msgs if m["settings"]])["settings"])
        target[rng.choice(SETTING_KEYS)] = rng.choice(POOL)
    else:
        d["messages"][rng.randrange(1, len(msgs))]["seed"] = rng.choice(POOL)
    return json.dumps(d).encode()


def _damage_bytes(rng, raw: bytes) -> bytes:
    buf = bytearray(raw)
    if rng.random() < 0.4:
        return bytes(buf[:rng.randrange(len(buf))])
    for _ in range(rng.randint(1, 8)):
        buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
    return bytes(buf)


def _flip_snapshot_data(rng, raw: bytes) -> bytes:
    """Bytes flipped past the header: the file still reads, its numbers are wrong."""
    buf = bytearray(raw)
    start = 8 + int.from_bytes(buf[:8], "little")
    for _ in range(rng.randint(1, 8)):
        buf[rng.randrange(start, len(buf))] ^= 1 << rng.randrange(8)
    return bytes(buf)


def _cache(chat):
    return {k: v.clone() for k, v in chat.cache.state_dict().items()}


def _one_line(e: Exception) -> bool:
    return "\n" not in str(e) and str(e).strip() != ""


def test_damaged_session_files_and_snapshots_load_or_fail_cleanly_and_never_change_the_conversation():
    model = make_chat_model()
    tok = tokenizer()
    vocab = model.cfg.vocab_size
    chat = make_chat(model, max_new=8, seed=3, system_prompt="Be brief.")
    for text in ("hello there", "why the cat?", "and the dog?"):
        chat.send(text)
    other = make_chat(model, max_new=8, seed=4)
    other.send("tell me about the moon")
    sid = chat.session.id
    path, snap = S.session_path(sid), S.snapshot_path(sid)
    good_json, good_snap = path.read_bytes(), snap.read_bytes()
    foreign_snap = S.snapshot_path(other.session.id).read_bytes()
    data = json.loads(good_json)
    chat.close()
    other.close()

    rng = random.Random(16)
    outcomes = {"refused": 0, "continued": 0, "snapshot used": 0, "replayed": 0}
    for n in range(1, CASES + 1):
        j, s = good_json, good_snap
        kind = rng.randrange(10)
        if kind < 5:
            j = _mutate_json(rng, data, vocab)
        elif kind == 5:
            j = _damage_bytes(rng, good_json)
        elif kind == 6:
            s = _flip_snapshot_data(rng, good_snap)
        elif kind == 7:
            s = _damage_bytes(rng, good_snap)
        elif kind == 8:
            s = foreign_snap
        else:
            j, s = _mutate_json(rng, data, vocab), _flip_snapshot_data(rng, good_snap)
        path.write_bytes(j)
        snap.write_bytes(s)
        case = f"case {n} (kind {kind})"
        try:
            sess = S.load(sid)
        except S.SessionError as e:
            assert _one_line(e) and str(path) in str(e), (case, str(e))
            outcomes["refused"] += 1
            continue
        shown = safe_text(SE.export_markdown(sess))
        assert not any(ord(c) < 32 and c not in "\n\t" or 0x7f <= ord(c) <= 0x9f for c in shown), case
        try:
            restored = Chat.restore(sid, model, tok, max_len=512, autosave=False)
        except (S.SessionError, ChatError) as e:
            assert _one_line(e), (case, str(e))
            outcomes["refused"] += 1
            continue
        outcomes["continued"] += 1
        outcomes["snapshot used"] += restored.used_snapshot
        rebuilt = Chat.restore(sid, model, tok, max_len=512, autosave=False, use_snapshot=False)
        got, want = _cache(restored), _cache(rebuilt)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got), case
        assert s == good_snap or not restored.used_snapshot, case     # a damaged snapshot is never used
        if n % 8 == 0:
            try:
                replay(make_chat(model, autosave=False), sess)
                outcomes["replayed"] += 1
            except (S.SessionError, ChatError) as e:
                assert _one_line(e), (case, str(e))
    print(f"fuzz: {CASES} cases: {outcomes}")
    assert outcomes["refused"] > CASES // 4 and outcomes["continued"] > CASES // 10
