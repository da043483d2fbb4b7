"""Regenerate the README's screenshots of the app (SVG, exported by Textual).

    python docs/screenshots.py [--model PATH] [--out docs] [--only NAME ...]

Without --model the app runs the random-weight test model of tests/support.py (its replies are noise: the
screenshots show the app, not a model); the replay screenshot always does. Each screenshot is one scripted session
in a headless app, 140x40.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "app")]
SIZE = (140, 40)
PROMPT = "Hello! Tell me about the cat."


async def shoot(app, script, path: Path) -> None:
    from app_support import ready
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await script(pilot)
        await pilot.pause(0.3)
        path.write_text(app.export_screenshot(title="tinychat"), encoding="utf-8")
    print("wrote", path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "docs")
    ap.add_argument("--only", nargs="+", default=None, metavar="NAME",
                    help="only these: chat settings sessions replay fork ab")
    a = ap.parse_args()
    os.environ["TINYCHAT_HOME"] = tempfile.mkdtemp(prefix="tinychat-shots-")
    import torch
    torch.set_num_threads(1)
    from app_support import ChatFactory, idle, say, start, wait_for
    from support import make_chat, make_chat_model, tokenizer

    from tinychat.chat import ChatSettings
    from tinychat.tui.app import TinyChatApp, make_app
    from tinychat.tui.runtime import Backend

    model = make_chat_model()
    settings = dict(temperature=0.0, max_new=48, seed=1)

    def app_for(**kw):
        if a.model is not None:
            return TinyChatApp(Backend(a.model, settings=ChatSettings(**settings)), blink=False, **kw)
        return make_app(ChatFactory(model, **settings), blink=False, **kw)

    async def chat_and_inspect(pilot):
        await say(pilot, PROMPT)
        await say(pilot, PROMPT)                 # the same again: the phrase ban fires on the first reply's 3-grams
        reply = pilot.app.view.replies()[-1]
        banned = [i for i, tr in reply.traces.items() if any(c.banned_by for c in tr.candidates)]
        await pilot.press("ctrl+t", "home", *["right"] * (banned[0] if banned else 0))

    async def settings_screen(pilot):
        await say(pilot, PROMPT)
        await pilot.press("f2")

    async def sessions_screen(pilot):
        await say(pilot, PROMPT)
        await pilot.press("ctrl+s")

    async def fork(pilot):
        # a reply forked once at token #4 (Tab, Down, Enter in the inspector), then the forked reply's token #6 being
        # picked: the candidates to fork at, the pick on the second, the ‹ 2/2 › of the first fork
        await say(pilot, "Any tips for a beginner runner?")
        await pilot.press("ctrl+t", "home", *["right"] * 4, "tab", "down", "enter")
        await idle(pilot)
        await pilot.press("ctrl+t", "home", *["right"] * 6, "tab", "down")

    async def ab(pilot):
        await say(pilot, PROMPT)
        await say(pilot, PROMPT)
        await start(pilot, "/ab ban=off penalty=1.0")
        await wait_for(pilot, lambda: getattr(pilot.app.screen, "result", None) is not None, what="the A/B result")

    def want(name):
        return a.only is None or name in a.only

    a.out.mkdir(parents=True, exist_ok=True)
    if want("chat"):
        asyncio.run(shoot(app_for(), chat_and_inspect, a.out / "app-chat.svg"))
    if want("settings"):
        asyncio.run(shoot(app_for(), settings_screen, a.out / "app-settings.svg"))
    if want("fork"):
        asyncio.run(shoot(app_for(), fork, a.out / "app-fork.svg"))
    if want("ab"):
        asyncio.run(shoot(app_for(), ab, a.out / "app-ab.svg"))
    if want("sessions"):
        for title, turns in (("Cats and dogs", ("hello", "tell me about the dog")),
                             ("A poem about the river", ("poem",))):
            chat = make_chat(model=model, max_new=12)
            for t in turns:
                chat.send(t)
            chat.save(title)
        asyncio.run(shoot(app_for(), sessions_screen, a.out / "app-sessions.svg"))
    if not want("replay"):
        return

    # replay: a recorded session played back; its second reply was edited after the fact (one token), so the
    # regeneration departs from the record there and the app marks it
    chat = make_chat(model=model, temperature=0.0, max_new=24)
    chat.send(PROMPT)
    chat.send("Tell me more about the river.")
    sess = chat.session
    tok = tokenizer()
    gen = len(tok.generation_prompt_ids())
    rec = sess.messages[-1]
    ids = list(rec.token_ids)
    ids[gen + 6] = (ids[gen + 6] + 1) % 300 + 3
    sess.messages[-1] = dataclasses.replace(rec, token_ids=ids, content=tok.decode(ids[gen:-2], skip_special=True))

    async def replay(pilot):
        await wait_for(pilot, lambda: pilot.app.replay_summary is not None, what="the replay")
        await idle(pilot)
        await pilot.press("ctrl+t", "home", *["right"] * 6)

    replay_app = make_app(ChatFactory(model), replay=sess, replay_speed=0, blink=False)
    asyncio.run(shoot(replay_app, replay, a.out / "app-replay.svg"))


if __name__ == "__main__":
    main()
