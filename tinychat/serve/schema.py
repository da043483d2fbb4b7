"""Request bodies -> TurnRequest, validated by hand so that every refusal is a 400 naming its parameter (OpenAI's
shape). Unknown fields are ignored, as OpenAI's clients send many; fields whose non-default values tinychat cannot
honour (n > 1, tools, logit_bias, frequency / presence penalties, JSON output) are refused, never silently dropped.

Sampler mapping: temperature, top_p, max_tokens / max_completion_tokens and seed map to tinychat's own settings;
tinychat's extension fields are repetition_penalty (multiplicative, over penalty_window content tokens),
penalty_window, phrase_ban (3-grams the assistant said in earlier turns), no_parrot (the user message's 3-grams),
ban_reply (the reply's own 3-grams). Torch-free."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .errors import ApiError, bad

MAX_STOPS = 4               # OpenAI's limit
MAX_TOP_LOGPROBS = 20       # OpenAI's limit (chat); the trace records the final top 20 when asked
MAX_SEED = 2 ** 63          # tinychat's seeds: 0 <= seed < 2^63
ROLES = ("system", "developer", "user", "assistant")


@dataclass
class TurnRequest:
    """One request as the runtime takes it: a conversation ending in a user message, and its sampler settings."""
    kind: str                                   # "chat" (/v1/chat/completions) or "text" (/v1/completions)
    model: str
    user: str                                   # the message to answer
    system: str | None = None                   # None: the model's default system prompt ("" : none)
    history: list[tuple[str, str]] = field(default_factory=list)   # earlier (user, assistant) turns
    settings: dict = field(default_factory=dict)                   # ChatSettings fields the request sets
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    stop: list[str] = field(default_factory=list)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _number(body: dict, key: str, lo: float, hi: float) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if not _is_num(v) or not lo <= v <= hi:
        raise bad(f"{key} must be a number between {lo:g} and {hi:g} (got {v!r})", key)
    return float(v)


def _int(body: dict, key: str, lo: int, hi: int) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise bad(f"{key} must be an integer between {lo:,} and {hi:,} (got {v!r})", key)
    return v


def _bool(body: dict, key: str) -> bool | None:
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, bool):
        raise bad(f"{key} must be true or false (got {v!r})", key)
    return v


def _model(body: dict, served: str) -> str:
    m = body.get("model")
    if not isinstance(m, str) or not m:
        raise bad("model is required: the id `GET /v1/models` lists", "model")
    if m != served:
        # the name is only compared, never looked up anywhere (no path from a request reaches the filesystem)
        raise ApiError(404, f"The model {m[:100]!r} does not exist: this server serves {served!r}", "model",
                       "model_not_found")
    return m


def _refuse_unsupported(body: dict) -> None:
    n = body.get("n")
    if n is not None and n != 1:
        raise bad(f"n must be 1: one model, one decoder, one choice per request (got {n!r})", "n")
    for key in ("tools", "functions", "tool_choice", "function_call"):
        if body.get(key) not in (None, [], "none"):
            raise bad(f"{key} is not supported by tinychat serve", key)
    if body.get("logit_bias") not in (None, {}):
        raise bad("logit_bias is not supported by tinychat serve (phrase_ban and repetition_penalty are its "
                  "sampler's own controls)", "logit_bias")
    for key in ("frequency_penalty", "presence_penalty"):
        v = body.get(key)
        if v is not None and (not _is_num(v) or v != 0):
            raise bad(f"{key} is not supported: tinychat's penalty is multiplicative, not additive; use "
                      f"repetition_penalty (1 = off) and penalty_window instead", key)
    rf = body.get("response_format")
    if rf is not None and not (isinstance(rf, dict) and rf.get("type") == "text"):
        raise bad("response_format: only {\"type\": \"text\"} is supported (no JSON mode or JSON schema yet)",
                  "response_format")


def _sampler(body: dict, max_tokens_cap: int) -> dict:
    """ChatSettings fields from the request (those it sets)."""
    s: dict = {}
    t = _number(body, "temperature", 0.0, 2.0)
    if t is not None:
        s["temperature"] = t
    p = _number(body, "top_p", 0.0, 1.0)
    if p is not None:
        if p < 0.01:
            raise bad(f"top_p must be at least 0.01 here (got {p:g}); use temperature 0 for greedy decoding", "top_p")
        s["top_p"] = p
    for key in ("max_completion_tokens", "max_tokens"):
        n = _int(body, key, 1, max_tokens_cap)
        if n is not None:
            s["max_new"] = n
            break
    seed = _int(body, "seed", 0, MAX_SEED - 1)
    if seed is not None:
        s["seed"] = seed
    r = _number(body, "repetition_penalty", 1.0, 5.0)
    if r is not None:
        s["penalty"] = r
    w = _int(body, "penalty_window", 0, 100000)
    if w is not None:
        s["penalty_window"] = w
    for key, name in (("phrase_ban", "ban"), ("no_parrot", "no_parrot"), ("ban_reply", "ban_reply")):
        b = _bool(body, key)
        if b is not None:
            s[name] = b
    return s


def _stops(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(x, str) and x for x in stops) or len(stops) > MAX_STOPS:
        raise bad(f"stop must be a non-empty string or a list of at most {MAX_STOPS} of them", "stop")
    return list(stops)


def _text(content, where: str) -> str:
    """A message's content: a string, or a list of text parts (joined); anything else is refused."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad(f"{where}: only text content is supported", where)
            parts.append(part["text"])
        return "".join(parts)
    raise bad(f"{where}: content must be a string or a list of text parts", where)


def _messages(body: dict) -> tuple[str | None, list[tuple[str, str]], str]:
    """(system or None, earlier turns, the last user message): leading system (or developer) messages, then user and
    assistant messages in turn, ending with a user message."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages must be a non-empty list", "messages")
    items = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"{where} must be an object with role and content", where)
        role = m.get("role")
        if role not in ROLES:
            raise bad(f"{where}.role must be one of system, user, assistant (got {str(role)[:40]!r}; tools are not "
                      f"supported)", f"{where}.role")
        if m.get("tool_calls"):
            raise bad(f"{where}: tool_calls are not supported", where)
        items.append(("system" if role == "developer" else role, _text(m.get("content"), f"{where}.content")))
    system = None
    while items and items[0][0] == "system":
        text = items.pop(0)[1]
        system = text if system is None else system + "\n\n" + text
    if not items:
        raise bad("messages must end with a user message", "messages")
    for j, (role, _) in enumerate(items):
        want = "user" if j % 2 == 0 else "assistant"
        if role != want:
            where = f"messages[{j + len(msgs) - len(items)}]"
            if role == "system":
                raise bad(f"{where}: a system message can only come first", where)
            raise bad(f"{where}: messages must alternate user and assistant after the system message (got two "
                      f"{role} messages in a row)", where)
    if items[-1][0] != "user":
        raise bad("messages must end with a user message (continuing an assistant message is not supported)",
                  "messages")
    for j, (role, text) in enumerate(items):
        if role == "user" and not text.strip():
            raise bad(f"messages[{j + len(msgs) - len(items)}]: empty user message", "messages")
    history = [(items[j][1], items[j + 1][1]) for j in range(0, len(items) - 1, 2)]
    return system, history, items[-1][1]


def _stream(body: dict) -> tuple[bool, bool]:
    stream = bool(_bool(body, "stream"))
    opts = body.get("stream_options")
    include = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise bad("stream_options must be an object", "stream_options")
        include = bool(_bool(opts, "include_usage"))
    return stream, include


def parse_chat(body, served: str, max_tokens_cap: int) -> TurnRequest:
    """POST /v1/chat/completions' body -> TurnRequest (ApiError 400 / 404 otherwise)."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    model = _model(body, served)
    _refuse_unsupported(body)
    system, history, user = _messages(body)
    stream, include = _stream(body)
    logprobs = bool(_bool(body, "logprobs"))
    top = _int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not logprobs:
        raise bad("top_logprobs needs logprobs: true", "top_logprobs")
    return TurnRequest("chat", model, user, system, history, _sampler(body, max_tokens_cap), stream, include,
                       logprobs, top or 0, _stops(body))


def parse_completion(body, served: str, max_tokens_cap: int) -> TurnRequest:
    """POST /v1/completions' body -> TurnRequest: the prompt is sent as one user message of a new chat (tinychat's
    models are chat models; raw-text continuation is not offered). logprobs: the number of top tokens (0-20)."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    model = _model(body, served)
    _refuse_unsupported(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt.strip():
        raise bad("prompt must be a non-empty string (one prompt per request)", "prompt")
    if body.get("echo"):
        raise bad("echo is not supported", "echo")
    if body.get("suffix") not in (None, ""):
        raise bad("suffix is not supported", "suffix")
    best_of = body.get("best_of")
    if best_of not in (None, 1):
        raise bad("best_of must be 1", "best_of")
    stream, include = _stream(body)
    top = _int(body, "logprobs", 0, MAX_TOP_LOGPROBS)
    return TurnRequest("text", model, prompt, None, [], _sampler(body, max_tokens_cap), stream, include,
                       top is not None, top or 0, _stops(body))
