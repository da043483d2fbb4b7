"""The status bar: model, decode mode (and whether --quant auto chose it), device, tok/s, time to first token, cache
fill, autosave state."""
from __future__ import annotations

from textual.reactive import reactive
from textual.widgets import Static
from rich.text import Text

from .format import size, visible


class StatusBar(Static):
    """One line; `update_status(...)` sets any of its fields (unknown ones keep their value)."""

    state: reactive[dict] = reactive(dict, always_update=True)

    FIELDS = ("model", "mode", "auto", "device", "quant", "tok_s", "ttft_ms", "cache_tokens", "max_len", "cache_bytes",
              "autosave", "activity")

    def on_mount(self) -> None:
        self.auto_links = False     # no @click links here; the link pass would unpickle every segment's style meta

    def __init__(self, **kw):
        super().__init__("", **kw)
        self.values: dict = {"model": "loading…", "activity": ""}

    def update_status(self, **values) -> None:
        self.values.update({k: v for k, v in values.items() if k in self.FIELDS})
        self.state = dict(self.values)

    NARROW = 100        # below this many columns: the compact line (no device, no cache bytes, the activity early)

    def render(self) -> Text:
        v = self.values
        narrow = 0 < self.size.width < self.NARROW
        t = Text(no_wrap=True, overflow="ellipsis")
        sep = (" │ ", "dim")
        t.append(f" {visible(v.get('model', ''))}", style="bold")      # a folder's name: no escape reaches the screen
        if "mode" in v:
            mode = v["mode"]
            if narrow:
                mode = mode.removeprefix("fast-")            # int8, bf16, eager, graph
            if mode == "eager" and v.get("quant") == "none":
                mode = "eager fp32"
            if v.get("auto"):                  # --quant auto chose it (why: /info)
                mode = f"auto:{mode}" if narrow else f"auto → {mode}"
            t.append_text(Text.assemble(sep, (mode, "cyan")))
            if not narrow:
                t.append_text(Text.assemble(sep, (v.get("device", ""), "")))
        if narrow and v.get("activity"):        # what runs now matters more than the figures that follow
            t.append_text(Text.assemble(sep, (v["activity"], "bold yellow")))
        if v.get("tok_s") is not None:
            t.append_text(Text.assemble(sep, (f"{v['tok_s']:.0f} tok/s", "green")))
        if v.get("ttft_ms") is not None:
            ms = v["ttft_ms"]
            t.append_text(Text.assemble(sep, f"TTFT {ms / 1000:.1f} s" if narrow and ms >= 1000 else
                                        f"TTFT {ms:.0f} ms"))
        if "cache_tokens" in v:
            fill = f"cache {v['cache_tokens']}/{v.get('max_len', '?')}"
            t.append_text(Text.assemble(sep, fill if narrow else f"{fill} · {size(v.get('cache_bytes', 0))}"))
        if v.get("autosave"):
            t.append_text(Text.assemble(sep, (v["autosave"], "dim")))
        if not narrow and v.get("activity"):
            t.append_text(Text.assemble(sep, (v["activity"], "bold yellow")))
        return t

    def on_resize(self) -> None:
        self.refresh()
