"""Response bodies: chat.completion / text_completion objects, their streamed chunks (`data: {...}` lines of
server-sent events, ending in `data: [DONE]`), usage, and the `tinychat` extension object (the seed every reply can
be reproduced with, the saved session, the cache reuse)."""
from __future__ import annotations

import json
import secrets
import time

from .logprobs import legacy

DONE_LINE = b"data: [DONE]\n\n"


def new_id(kind: str, seq: int) -> str:
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{seq}-{secrets.token_hex(6)}"


def event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"


def usage(out) -> dict:
    return {"prompt_tokens": out.prompt_tokens, "completion_tokens": out.completion_tokens,
            "total_tokens": out.prompt_tokens + out.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": out.cached_tokens}}


def extension(out, seq: int) -> dict:
    return {"seed": out.seed, "session": out.session, "request": seq, "cached_tokens": out.cached_tokens,
            "dropped_turns": out.dropped_turns, "ttft_ms": round(out.ttft_ms, 2),
            "decode_tok_s": round(out.decode_tok_s, 2)}


class Reply:
    """One request's response in the making: its id, time, model, and the kind of object (chat or text)."""

    def __init__(self, kind: str, seq: int, model: str, logprobs: bool):
        self.kind, self.seq, self.model, self.logprobs = kind, seq, model, logprobs
        self.id = new_id(kind, seq)
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": None}

    # -- whole objects ------------------------------------------------------------------------------------------
    def whole(self, text: str, entries: list[dict], offsets: list[int], out) -> dict:
        finish = out.finish if out.finish in ("stop", "length") else "stop"
        if self.kind == "chat":
            lp = {"content": entries, "refusal": None} if self.logprobs else None
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                      "logprobs": lp, "finish_reason": finish}
            obj = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": legacy(entries, offsets) if self.logprobs else None,
                      "finish_reason": finish}
            obj = self._head("text_completion")
        obj.update(choices=[choice], usage=usage(out), tinychat=extension(out, self.seq))
        return obj

    # -- chunks -------------------------------------------------------------------------------------------------
    def first_chunk(self) -> bytes | None:
        """The chat stream's opening chunk (the role); none for text completions."""
        if self.kind != "chat":
            return None
        return event(self._chunk({"role": "assistant", "content": ""}, None, None))

    def delta_chunk(self, text: str, entries: list[dict], offsets: list[int]) -> bytes:
        if self.kind == "chat":
            lp = {"content": entries, "refusal": None} if self.logprobs else None
            return event(self._chunk({"content": text}, lp, None))
        return event(self._chunk(text, legacy(entries, offsets) if self.logprobs else None, None))

    def last_chunks(self, out, include_usage: bool) -> bytes:
        finish = out.finish if out.finish in ("stop", "length") else "stop"
        last = self._chunk({} if self.kind == "chat" else "", None, finish)
        last["tinychat"] = extension(out, self.seq)
        data = event(last)
        if include_usage:
            u = self._head("chat.completion.chunk" if self.kind == "chat" else "text_completion")
            u.update(choices=[], usage=usage(out))
            data += event(u)
        return data + DONE_LINE

    def _chunk(self, delta, logprobs, finish) -> dict:
        if self.kind == "chat":
            obj = self._head("chat.completion.chunk")
            obj["choices"] = [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]
        else:
            obj = self._head("text_completion")
            obj["choices"] = [{"index": 0, "text": delta, "logprobs": logprobs, "finish_reason": finish}]
        return obj
