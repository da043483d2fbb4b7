"""The app and per-model sampler defaults: F2 shows where each value came from (the model's sampler.json, tinychat,
a flag, /set), and a new chat on the shipped demo model says what it is and the one command that gets a real one."""
from app_support import ChatFactory, ready
from tinychat.hub import RECOMMENDED
from tinychat.tui.app import make_app

SIZE = (130, 40)


class SourcedFactory(ChatFactory):
    """Chats with the sources open_chat would give them (a model whose sampler.json sets temperature and top-p)."""

    def __init__(self, model, name="tiny-test", **kw):
        super().__init__(model, **kw)
        self.name = name

    def __call__(self, ref):
        chat = super().__call__(ref)
        chat.model_name = self.name
        chat.sources = {"temperature": "SmolLM2's model card (tinychat's table)", "top_p": "SmolLM2's model card "
                        "(tinychat's table)", "max_new": "flag", "penalty": "tinychat's default"}
        return chat


async def test_the_settings_screen_shows_where_each_value_came_from(chat_model):
    app = make_app(SourcedFactory(chat_model), blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("f2")
        await pilot.pause()
        line = str(app.screen.query_one("#settings-sources").render())
        assert line == ("Where the values come from: Temperature, Top-p: SmolLM2's model card (tinychat's table) · "
                        "Max new tokens: a command-line flag · the rest: tinychat's defaults")
        app.screen.query_one("#set-top_p").value = "0.5"
        await pilot.press("ctrl+s")
        await pilot.pause()
        await pilot.press("f2")
        await pilot.pause()
        line = str(app.screen.query_one("#settings-sources").render())
        assert "Temperature: SmolLM2's model card (tinychat's table) · Top-p: changed here or with /set · " \
               "Max new tokens: a command-line flag · the rest" in line


async def test_a_new_chat_on_the_demo_model_points_at_a_real_one(chat_model):
    for name, shown in (("default", True), ("smollm2", False)):
        app = make_app(SourcedFactory(chat_model, name=name), blink=False)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot)
            text = " ".join(str(w.render()) for w in app.query(".notice"))
            assert ("21.7M-parameter demo" in text and f"tinychat pull {RECOMMENDED}" in text) is shown, text
