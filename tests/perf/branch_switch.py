"""Switching between two replies that share a long prefix (issue #14), with the shipped model.

A chat with a long first turn (the prefix, --prefix tokens in all), then a short turn whose reply is regenerated:
two sibling replies. Times `Chat.switch_alternative("next")` two ways: to a branch the chat left earlier (its cache kept
by branch_cache.py: cut back to the turn's mark, copy the kept tail in), and to one it has not decoded (the stash
cleared first: cut back, feed that turn by the restore rule, one prefill of the user message and one decoder step per
reply token); and a full rebuild of the same path (what a switch would cost without the cut), medians over --repeats, and checks that the switched
cache is bit-identical to a fresh rebuild. Also writes a session with --branches alternatives and gives its size.

    python tests/perf/branch_switch.py [--quant int8] [--prefix 1500] [--reply 32] [--repeats 9] [--branches 20]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # this checkout's tinychat, not an installed one

import torch  # noqa: E402

from tinychat.sessions import session as S  # noqa: E402
from tinychat.chat.runtime import Chat  # noqa: E402
from tinychat.loading import load_runtime  # noqa: E402
from tinychat.settings import ChatSettings  # noqa: E402


def _ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quant", default="int8")
    ap.add_argument("--prefix", type=int, default=1500)
    ap.add_argument("--reply", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--branches", type=int, default=20)
    a = ap.parse_args()
    rt = load_runtime(None)
    tmp = Path(tempfile.mkdtemp())
    chat = Chat(rt.model, rt.tokenizer, ChatSettings(max_new=a.reply, seed=1), quant=a.quant, model_name=rt.name,
                model_hash=rt.identity, sessions_dir=tmp)
    words = "the quick brown fox jumps over the lazy dog while the cat sleeps by the warm fire ".split()
    text, n = [], 0
    while n < a.prefix - a.reply - 40:
        text.append(words[len(text) % len(words)])
        n = len(rt.tokenizer.message_ids("user", " ".join(text)))
    chat.send(" ".join(text))
    chat.send("Tell me a short story.")
    chat.set("seed", "2")
    chat.regenerate()
    prefix = len(chat.session.context_ids()) - len(chat.session.messages[-1].token_ids) \
        - len(chat.session.messages[-2].token_ids)
    n_user = len(chat.session.messages[-2].token_ids)
    n_replies = [len(m.token_ids) for m in (chat.session.branches[-1], chat.session.messages[-1])]
    chat.autosave = False                # the switch itself; the autosave after it is timed apart
    switch = [_ms(lambda: chat.switch_alternative("next")) for _ in range(a.repeats)]
    fed = []
    for _ in range(a.repeats):
        chat.timeline.left.clear()               # a branch this chat has not decoded: fed by the restore rule
        fed.append(_ms(lambda: chat.switch_alternative("next")))
    rebuild = [_ms(lambda: chat.timeline.rebuild(chat.session)) for _ in range(max(3, a.repeats // 3))]
    chat.autosave = True
    save = [_ms(chat.save) for _ in range(max(3, a.repeats // 3))]
    chat.switch_alternative("next")
    fresh = Chat(rt.model, rt.tokenizer, ChatSettings(max_new=a.reply), autosave=False, model_name=rt.name,
                 model_hash=rt.identity, session=S.Session(**{k: getattr(chat.session, k) for k in (
                     "id", "model", "tokenizer_hash", "quant", "device", "settings")},
                     messages=list(chat.session.messages)))
    ring = {"lk", "lv"}                  # the rings' last slot is scratch (padded writes land there): not compared
    same = all(torch.equal(x[..., :-1, :] if k in ring else x, fresh.cache.state_dict()[k][..., :-1, :]
                           if k in ring else fresh.cache.state_dict()[k])
               for k, x in chat.cache.state_dict().items())
    for i in range(a.branches - 2):
        chat.set("seed", str(10 + i))
        chat.regenerate()
    size = S.session_path(chat.session.id, tmp).stat().st_size
    print(f"model {rt.name} quant {chat.quant} threads {torch.get_num_threads()} step {chat.step_name()}")
    print(f"shared prefix {prefix} tokens; the switched turn's own: user message {n_user} tokens (with the pending "
          f"newline and the generation prompt: one prefill), replies {n_replies[0]} and {n_replies[1]} tokens (one step each)")
    print(f"switch to a branch left earlier (its cache kept): median {statistics.median(switch):.2f} ms "
          f"(min {min(switch):.2f}, n={len(switch)})")
    print(f"switch to a branch fed again (restore rule): median {statistics.median(fed):.1f} ms "
          f"(min {min(fed):.1f}, n={len(fed)})")
    print(f"full rebuild of the path: median {statistics.median(rebuild):.1f} ms (n={len(rebuild)})")
    print(f"the autosave after a switch (session + KV snapshot): median {statistics.median(save):.1f} ms")
    print(f"switched cache bit-identical to a fresh rebuild: {same}")
    print(f"session file with {a.branches} alternatives of the last reply: {size / 1024:.1f} KiB")


if __name__ == "__main__":
    main()
