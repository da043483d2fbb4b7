"""The server's pure parts: stop strings over streamed pieces, request validation into TurnRequest."""
import pytest

from tinychat.serve.errors import ApiError
from tinychat.serve.schema import parse_chat, parse_completion
from tinychat.serve.stops import StopScanner


def _scan(pieces, stops):
    s = StopScanner(stops)
    out = [s.push(p) for p in pieces]
    return out, s.flush(), s


def test_a_stop_string_split_across_pieces_is_held_back_then_cut():
    out, tail, s = _scan(["Hello wo", "rld, EN", "D here"], ["END"])
    assert out == ["Hello wo", "rld, ", ""] and tail == "" and s.stopped_at == len("Hello world, ")


def test_held_text_that_turns_out_not_to_be_a_stop_is_given_out():
    out, tail, s = _scan(["abc E", "N", "x and more"], ["END"])
    assert "".join(out) + tail == "abc ENx and more" and s.stopped_at is None
    assert out[0] == "abc " and out[1] == ""          # "E", then "EN", could still start END


def test_the_earliest_of_several_stops_wins_and_nothing_after_it_is_given():
    out, tail, s = _scan(["one two three"], ["three", "two"])
    assert out == ["one "] and s.push("more") == "" and tail == ""


def test_no_stops_gives_every_piece_at_once():
    out, tail, _ = _scan(["a", "b\n", ""], [])
    assert out == ["a", "b\n", ""] and tail == ""


def _chat(**kw):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}
    return parse_chat(body, "m", 1000)


def test_a_chat_request_maps_onto_tinychat_settings():
    r = _chat(temperature=0.5, top_p=0.8, max_tokens=12, seed=7, repetition_penalty=1.1, penalty_window=10,
              phrase_ban=False, no_parrot=False, ban_reply=False, stop="x", logprobs=True, top_logprobs=3,
              stream=True, stream_options={"include_usage": True})
    assert r.settings == {"temperature": 0.5, "top_p": 0.8, "max_new": 12, "seed": 7, "penalty": 1.1,
                          "penalty_window": 10, "ban": False, "no_parrot": False, "ban_reply": False}
    assert r.stop == ["x"] and r.logprobs and r.top_logprobs == 3 and r.stream and r.include_usage


def test_messages_become_system_history_and_the_new_message():
    r = parse_chat({"model": "m", "messages": [
        {"role": "developer", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "a"}]},
        {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]}, "m", 10)
    assert (r.system, r.history, r.user) == ("be brief", [("a", "b")], "c")
    assert parse_chat({"model": "m", "messages": [{"role": "user", "content": "q"}]}, "m", 10).system is None


@pytest.mark.parametrize("kw, param", [
    (dict(n=2), "n"), (dict(temperature=2.5), "temperature"), (dict(temperature="hot"), "temperature"),
    (dict(top_p=0.0), "top_p"), (dict(max_tokens=0), "max_tokens"), (dict(max_tokens=1001), "max_tokens"),
    (dict(max_tokens=True), "max_tokens"), (dict(seed=-1), "seed"), (dict(top_logprobs=21, logprobs=True),
                                                                         "top_logprobs"),
    (dict(top_logprobs=2), "top_logprobs"), (dict(frequency_penalty=0.5), "frequency_penalty"),
    (dict(presence_penalty=1), "presence_penalty"), (dict(tools=[{"type": "function"}]), "tools"),
    (dict(logit_bias={"1": 5}), "logit_bias"), (dict(response_format={"type": "json_object"}), "response_format"),
    (dict(stop=["a", "b", "c", "d", "e"]), "stop"), (dict(stop=[""]), "stop"), (dict(stream="yes"), "stream"),
    (dict(messages=[]), "messages"), (dict(messages=[{"role": "tool", "content": "x"}]), "messages[0].role"),
    (dict(messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]), "messages[1]"),
    (dict(messages=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]), "messages"),
    (dict(messages=[{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]), "messages[1]"),
    (dict(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), "messages[0].content"),
    (dict(messages=[{"role": "user", "content": "  "}]), "messages"),
    (dict(temperature=float("nan")), "temperature"),
])
def test_each_bad_parameter_is_a_400_naming_it(kw, param):
    with pytest.raises(ApiError) as e:
        _chat(**kw)
    assert e.value.status == 400 and e.value.param == param
    assert set(e.value.body()["error"]) == {"message", "type", "param", "code"}


def test_another_model_is_a_404_and_the_name_is_only_compared():
    with pytest.raises(ApiError) as e:
        parse_chat({"model": "../../etc/passwd", "messages": [{"role": "user", "content": "x"}]}, "m", 10)
    assert e.value.status == 404 and e.value.code == "model_not_found"


def test_a_completion_request_is_one_user_message():
    r = parse_completion({"model": "m", "prompt": ["hello"], "logprobs": 2, "max_tokens": 5}, "m", 10)
    assert (r.kind, r.user, r.history, r.top_logprobs, r.logprobs) == ("text", "hello", [], 2, True)
    for bad in ({"prompt": ""}, {"prompt": ["a", "b"]}, {"prompt": "x", "echo": True}, {"prompt": "x", "best_of": 2}):
        with pytest.raises(ApiError):
            parse_completion({"model": "m", **bad}, "m", 10)


def test_a_trace_asked_for_n_candidates_holds_the_final_top_n():
    import torch

    from tinychat.sampler import TRACE_TOP, TurnHook
    logits = torch.randn(1, 300, generator=torch.Generator().manual_seed(0)) * 3
    for want in (True, 20):
        hook = TurnHook({}, 0.8, 0.9, 1.0, [], stop=0, trace=want)
        hook([], logits)
        hook._finish_trace(5)
        top = {c.token for c in hook.traces[0].candidates}
        n = TRACE_TOP if want is True else want
        final = torch.softmax(logits / 0.8, -1)[0].topk(n).indices.tolist()
        assert set(final) <= top and len(top) <= TRACE_TOP + n


def test_a_logprobs_entry_carries_a_partial_characters_own_bytes():
    """A byte-level token holding part of a UTF-8 character decodes to U+FFFD alone; its `bytes` are its own, so a
    client can join the bytes of consecutive tokens into the character (as OpenAI's field is meant for)."""
    from support import tokenizer

    from tinychat.serve.logprobs import _item
    tok = tokenizer()
    partial = next(i for i in range(tok.vocab_size) if tok.decode([i]) == "\ufffd")
    item = _item(tok, partial, 0.5)
    assert item["token"] == "\ufffd" and item["bytes"] != list("\ufffd".encode())
    assert bytes(item["bytes"]) == tok.token_bytes(partial) and len(item["bytes"]) == 1
    # a whole character's bytes split over two tokens join back into it
    ids = tok.encode("é")
    assert b"".join(tok.token_bytes(i) for i in ids).decode("utf-8") == "é"


HANG_S = 60            # only stops a hung test: every wait below is an hour unless what it tests ends it


def test_a_pacing_reader_sees_the_end_of_its_job_at_once():
    """A streamed reply's coroutine waits a pace between chunks; when the job ends meanwhile the wait stops, so the
    last chunk is not held back. The pace is an hour: a wait that did not stop at the end would hang (HANG_S)."""
    import asyncio
    import threading

    from tinychat.serve.worker import DELTA, DONE, Job

    async def run():
        job = Job(req=None)
        job.put(DELTA, "first")
        await job.next_batch()
        threading.Thread(target=job.put, args=(DONE, "outcome")).start()     # the end, from the decode thread
        await asyncio.wait_for(job.pace(3600.0), HANG_S)
        return await job.next_batch()

    assert asyncio.run(run()) == [(DONE, "outcome")]


def test_a_pace_without_an_end_waits_it_out():
    """Counted in event-loop turns, not seconds: an hour's pace is still waiting after many turns of the loop, and
    a short one ends by itself (no end comes)."""
    import asyncio

    from tinychat.serve.worker import DELTA, Job

    async def run():
        job = Job(req=None)
        job.put(DELTA, "x")
        waiting = asyncio.ensure_future(job.pace(3600.0))
        for _ in range(100):
            await asyncio.sleep(0)
        still = not waiting.done()
        waiting.cancel()
        await asyncio.wait_for(job.pace(0.01), HANG_S)
        return still

    assert asyncio.run(run())


@pytest.mark.parametrize("length", [b"\xb2", b"1\xb9", b"+12", b"1_0"])      # headers are Latin-1: ² ¹
def test_a_content_length_not_in_ascii_digits_is_a_400_not_a_crash(length):
    """Issue #33 item 7's sibling: "²".isdigit() is true but int("²") raises (uvicorn's parsers refuse such a header
    first; the app must not rely on it)."""
    import asyncio

    from tinychat.serve.app import create_app
    from tinychat.serve.config import ServeConfig

    class Runner:
        model_id = "m"

    sent: list = []
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "http_version": "1.1", "scheme": "http", "root_path": "",
             "server": ("127.0.0.1", 1), "client": ("127.0.0.1", 2),
             "headers": [(b"content-type", b"application/json"), (b"content-length", length)]}

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(create_app(Runner(), ServeConfig())(scope, receive, send))
    [start] = [m for m in sent if m["type"] == "http.response.start"]
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert start["status"] == 400 and b"bad Content-Length" in body, (start, body)
