"""The official `openai` client against a live server on the tiny model: models, chat completions streamed and
not, seeds (and the same reply as `tinychat -p`), logprobs with the `tinychat` field, stop strings, prefix reuse,
text completions."""
import json
import math

import pytest
from typer.testing import CliRunner

from tinychat.cli import app

Q = "tell me a story about the cat"


def _ask(server, model_id, text=Q, **kw):
    kw.setdefault("max_tokens", 24)
    return server.client().chat.completions.create(model=model_id, messages=[{"role": "user", "content": text}], **kw)


def _stream(server, model_id, messages, **kw):
    chunks = list(server.client().chat.completions.create(model=model_id, messages=messages, stream=True, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return chunks, text


def test_models_lists_the_one_served_model(server, model_id):
    (m,) = server.client().models.list().data
    assert m.id == model_id == model_dir_name(server)


def model_dir_name(server):
    return server.app.state.runner.model_id


def test_a_reply_with_its_usage(server, model_id):
    r = _ask(server, model_id, seed=1)
    c = r.choices[0]
    assert c.message.role == "assistant" and c.message.content and c.finish_reason in ("stop", "length")
    u = r.usage
    assert u.completion_tokens <= 24 and u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens == 0 and r.model_extra["tinychat"]["seed"] == 1


def test_a_seed_gives_the_same_tokens_every_time_streaming_or_not(server, model_id):
    a = _ask(server, model_id, seed=11, max_tokens=40, logprobs=True)
    b = _ask(server, model_id, seed=11, max_tokens=40, logprobs=True)
    chunks, text = _stream(server, model_id, [{"role": "user", "content": Q}], seed=11, max_tokens=40,
                           logprobs=True, stream_options={"include_usage": True})
    ids = [e.model_extra["tinychat"]["id"] for e in a.choices[0].logprobs.content]
    assert a.choices[0].message.content == b.choices[0].message.content == text
    assert ids == [e.model_extra["tinychat"]["id"] for e in b.choices[0].logprobs.content]
    assert ids == [e.model_extra["tinychat"]["id"] for c in chunks if c.choices and c.choices[0].logprobs
                   for e in c.choices[0].logprobs.content]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == a.usage.completion_tokens
    assert chunks[-2].choices[0].finish_reason == a.choices[0].finish_reason
    other = _ask(server, model_id, seed=12, max_tokens=40)
    assert other.choices[0].message.content != a.choices[0].message.content


def test_the_reply_is_the_one_tinychat_p_gives_with_the_same_seed_and_settings(server, model_id, model_dir):
    r = _ask(server, model_id, seed=5, max_tokens=30, temperature=0.7, extra_body={"repetition_penalty": 1.3})
    cli = CliRunner().invoke(app, ["--model", str(model_dir), "--quant", "none", "--no-save", "--json", "--seed",
                                   "5", "--max-new", "30", "--temperature", "0.7", "--penalty", "1.3", "-p", Q])
    assert cli.exit_code == 0, cli.output
    plain = json.loads(cli.stdout)
    assert plain["text"] == r.choices[0].message.content and plain["n_tokens"] == r.usage.completion_tokens


def test_logprobs_explain_every_token(server, model_id):
    r = _ask(server, model_id, "the cat sees the dog and the cat sees the bird", temperature=0, max_tokens=60,
             logprobs=True, top_logprobs=20)
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens == 60
    banned = []
    for e in entries:
        tc = e.model_extra["tinychat"]
        assert len(e.top_logprobs) == 20
        lps = [t.logprob for t in e.top_logprobs]
        assert lps == sorted(lps, reverse=True) and e.logprob == lps[0]       # greedy: the most likely
        assert math.isclose(math.exp(e.logprob), tc["p"], rel_tol=1e-6) and tc["rank"] == 0
        banned += [(b, tc) for b in tc["banned"]]
    assert banned, "the reply ban should have acted in a greedy reply of the tiny model"
    b, tc = banned[0]
    assert len(b["ngram"]) == 3 and b["ngram"][2] == b["token"] and tc["banned_total"] >= 1
    assert b["p_raw"] > 0
    assert "".join(e.token for e in entries) == r.choices[0].message.content


def test_a_stop_string_ends_the_reply_before_it(server, model_id):
    full = _ask(server, model_id, seed=3, max_tokens=40).choices[0].message.content
    stop = full[10:13]
    cut = full[:full.index(stop)]
    r = _ask(server, model_id, seed=3, max_tokens=40, stop=[stop, "\x00never"])
    assert r.choices[0].message.content == cut and r.choices[0].finish_reason == "stop"
    _, streamed = _stream(server, model_id, [{"role": "user", "content": Q}], seed=3, max_tokens=40, stop=stop)
    assert streamed == cut


def test_a_conversation_that_extends_the_last_one_reuses_the_cache_exactly(server, model_id):
    msgs = [{"role": "system", "content": "You are a cat."}, {"role": "user", "content": Q}]
    first = server.client().chat.completions.create(model=model_id, messages=msgs, seed=1, max_tokens=20)
    msgs += [{"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "and then?"}]
    cached = server.client().chat.completions.create(model=model_id, messages=msgs, seed=2, max_tokens=20)
    # the whole first exchange (and the stop token the runtime appends to a reply cut at max_tokens)
    assert first.usage.total_tokens <= cached.usage.prompt_tokens_details.cached_tokens <= first.usage.total_tokens + 1
    assert cached.usage.prompt_tokens > cached.usage.prompt_tokens_details.cached_tokens
    _ask(server, model_id, "something else entirely", seed=1, max_tokens=5)      # the server moves on
    rebuilt = server.client().chat.completions.create(model=model_id, messages=msgs, seed=2, max_tokens=20)
    assert rebuilt.usage.prompt_tokens_details.cached_tokens == 0
    assert rebuilt.choices[0].message.content == cached.choices[0].message.content
    assert rebuilt.usage.prompt_tokens == cached.usage.prompt_tokens


def test_a_text_completion_streamed_and_not(server, model_id):
    c = server.client().completions.create(model=model_id, prompt=Q, seed=4, max_tokens=16, logprobs=3)
    ch = c.choices[0]
    assert c.object == "text_completion" and ch.text and len(ch.logprobs.tokens) == c.usage.completion_tokens
    assert ch.logprobs.text_offset[0] == 0 and all(len(t) <= 3 for t in ch.logprobs.top_logprobs)
    s = server.client().completions.create(model=model_id, prompt=Q, seed=4, max_tokens=16, stream=True)
    assert "".join(x.choices[0].text for x in s if x.choices) == ch.text
    chat = _ask(server, model_id, seed=4, max_tokens=16)
    assert chat.choices[0].message.content == ch.text         # the prompt is one user message of a new chat


@pytest.mark.parametrize("path", ["/health"])
def test_health_answers_without_a_key(server, path):
    import httpx
    r = httpx.get(server.base + path, timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "ok"
