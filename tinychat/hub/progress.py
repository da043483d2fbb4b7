"""How `tinychat pull` shows itself on stderr: status lines, and while bytes arrive a bar with bytes, rate and time left
(rich) on a terminal; off a terminal, one line when the download ends (logs stay short)."""
from __future__ import annotations

import sys
import time

from .pull import Reporter
from .ref import human_bytes


class ConsoleReport(Reporter):
    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.bar = self.task = None
        self.started = self.last = None

    def line(self, text: str) -> None:
        self.close()
        from .. import textsafe
        print(textsafe.safe_line(text), file=self.stream, flush=True)

    def progress(self, done: int, total: int) -> None:
        if self.started is None:
            self.started, self.first = time.monotonic(), done
        self.last = (done, total)
        if not self.tty or total <= 0:
            return
        if self.bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
            from rich.text import Text

            class Rate(ProgressColumn):         # rich's TransferSpeedColumn counts in MB, the rest here in MiB
                def render(self, task):
                    return Text(f"{human_bytes(task.speed)}/s" if task.speed else "", style="progress.data.speed")

            self.bar = Progress(TextColumn("downloading"), BarColumn(), DownloadColumn(binary_units=True), Rate(),
                                TimeRemainingColumn(), transient=True, console=Console(file=self.stream))
            self.bar.start()
            self.task = self.bar.add_task("download", total=total, completed=done)
        self.bar.update(self.task, completed=done, total=total)

    def close(self, summary: bool = True) -> None:
        """Stop the bar (if any) and, once, say what the download did (unless summary is False)."""
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
        if summary and self.started is not None and self.last is not None:
            done, total = self.last
            secs = max(time.monotonic() - self.started, 1e-6)
            got = max(done - self.first, 0)
            if got:
                print(f"downloaded {human_bytes(done)} of {human_bytes(total)} in {secs:.1f} s, "
                      f"{human_bytes(got / secs)}/s", file=self.stream, flush=True)
            elif done >= total:
                print(f"all {human_bytes(total)} in the cache already", file=self.stream, flush=True)
            self.started = self.last = None
