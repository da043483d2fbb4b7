"""Stop strings over streamed text. The reply's text arrives in pieces; a piece may end with the start of a stop
string, so that part is held back until the next piece settles it. The text given out never contains a stop string
nor anything after one. Offsets count characters of the whole reply."""
from __future__ import annotations


class StopScanner:
    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.text = ""          # the reply so far (released and held)
        self.released = 0       # characters of self.text given out
        self.stopped_at: int | None = None   # where the first stop string starts (None: none seen)

    def push(self, piece: str) -> str:
        """Add a piece; return the text that can be given out now ("" while held, or once stopped)."""
        if self.stopped_at is not None:
            return ""
        self.text += piece
        if not self.stops:
            return self._release(len(self.text))
        # search from where a stop string could start that was not complete before this piece
        start = max(0, self.released - max(map(len, self.stops)) + 1)
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if hits:
            self.stopped_at = min(hits)
            return self._release(self.stopped_at)
        return self._release(len(self.text) - self._held_tail())

    def flush(self) -> str:
        """The end of the reply: whatever is still held (it was no stop string)."""
        if self.stopped_at is not None:
            return ""
        return self._release(len(self.text))

    def _held_tail(self) -> int:
        """The length of the longest end of the text that is the start of a stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:n]):
                    best = n
                    break
        return best

    def _release(self, upto: int) -> str:
        upto = max(upto, self.released)
        out = self.text[self.released:upto]
        self.released = upto
        return out
