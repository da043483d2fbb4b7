"""Helpers for the app tests: chat factories on the tiny test model (optionally slowed down, or with frozen speed
figures for snapshots), and Pilot waits."""
from __future__ import annotations

import asyncio
import dataclasses
import time

from textual.errors import NoWidget

from support import tokenizer

from tinychat.chat.runtime import Chat, ChatSettings


class SlowChat(Chat):
    """A chat whose decoding takes `delay` seconds per token (so a test can act mid-turn)."""
    delay = 0.0

    def run_turn(self, plan):
        if plan.on_token is not None and self.delay:
            inner = plan.on_token

            def on_token(*a):
                time.sleep(self.delay)
                inner(*a)
            plan = dataclasses.replace(plan, on_token=on_token)
        return super().run_turn(plan)


class FrozenChat(SlowChat):
    """Speed figures fixed (snapshot tests must not show measured timings)."""

    def run_turn(self, plan):
        r = super().run_turn(plan)
        r.ttft_ms, r.decode_tok_s = 12.0, 345.0
        return r


class ChatFactory:
    """factory(session_ref | None) -> Chat, as the app's FactoryBackend wants it. Records every chat it made."""

    def __init__(self, model, cls=SlowChat, delay: float = 0.0, fail: Exception | None = None, **settings):
        self.model, self.cls, self.delay, self.fail = model, cls, delay, fail
        # the sampler settings these tests were written against, pinned: the app's defaults are tuned for the
        # shipped model and may move
        self.settings = ChatSettings(**{"temperature": 0.7, "penalty": 1.1, **settings})
        self.chats: list[Chat] = []

    def __call__(self, ref: str | None):
        if self.fail is not None:
            raise self.fail
        kw = dict(model_name="tiny-test", max_len=512)
        if ref is None:
            chat = self.cls(self.model, tokenizer(), self.settings, **kw)
        else:
            chat = self.cls.restore(ref, self.model, tokenizer(), **kw)
        chat.delay = self.delay
        self.chats.append(chat)
        return chat


async def wait_for(pilot, cond, timeout: float = 20.0, step: float = 0.01, what: str = "condition"):
    """Poll `cond` while the app runs. (Not pilot.pause: it waits for every widget's queue to drain, which takes
    seconds while a reply streams.)"""
    t = time.monotonic()
    while not cond():
        if time.monotonic() - t > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(step)


async def ready(pilot):
    app = pilot.app
    await wait_for(pilot, lambda: app.chat is not None or app.load_error, what="the model to load")
    await pilot.pause()


async def idle(pilot, timeout: float = 20.0):
    app = pilot.app
    await wait_for(pilot, lambda: app.busy is None, timeout, what="the app to be idle")
    await pilot.pause(0.01)


async def start(pilot, text: str):
    """Put a message in the prompt and send it (as Enter does), without waiting for the reply."""
    app = pilot.app
    app.prompt.load_text(text)
    app.prompt.submit()
    await wait_for(pilot, lambda: app.busy is not None or not app.prompt.text, what="the message to go")


async def say(pilot, text: str):
    """Send a message and wait for the reply."""
    await start(pilot, text)
    await idle(pilot)


def notes(app, severity: str | None = None) -> list[str]:
    return [m for sev, m in app.notices if severity is None or sev == severity]


async def click_on(pilot, widget, offset: tuple[int, int] = (0, 0), timeout: float = 20.0):
    """Click `widget` once it is laid out and on screen, and fail unless the click landed on it. (Right after a view
    rebuild, a widget can be mounted with an empty region; a click then goes to whatever sits at the screen's corner,
    which made a test flaky on a loaded machine.)"""
    def placed() -> bool:
        try:
            return widget.is_attached and widget.region.area > 0 and pilot.app.screen.find_widget(widget).region.area > 0
        except NoWidget:        # not in the screen's map yet
            return False
    await wait_for(pilot, placed, timeout, what=f"{type(widget).__name__} to be laid out")
    await pilot.pause()
    assert await pilot.click(widget, offset=offset), f"the click did not land on {type(widget).__name__}"


def _text_of(widget) -> str:
    """What a widget shows now, its lines joined."""
    from textual.geometry import Region
    strips = widget.render_lines(Region(0, 0, widget.size.width, widget.size.height))
    return "\n".join(s.text for s in strips)


def _inside(app, widget) -> bool:
    """Whether the widget is shown whole within the screen."""
    r, screen = widget.region, app.screen.region
    return r.width > 0 and r.height > 0 and screen.contains_region(r)
