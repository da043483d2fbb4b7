"""Errors in OpenAI's shape with the right status for each bad input, the API key on and off, and the CLI's
`serve` command: lazy, one-line errors, the warning for a public bind without a key."""
import json

import httpx
import openai
import pytest
from typer.testing import CliRunner

from serve_support import runner_for, start
from tinychat.cli import app


def _post(server, path, body, headers=None, raw=None):
    return httpx.post(server.base + path, content=raw if raw is not None else json.dumps(body),
                      headers={"Content-Type": "application/json", **(headers or {})}, timeout=30)


def _shape(r, status, param=None, code=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    return err


def _chat(model_id, **kw):
    return {"model": model_id, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, **kw}


@pytest.mark.parametrize("kw, param", [
    (dict(n=3), "n"), (dict(temperature=9), "temperature"), (dict(max_tokens=10 ** 6), "max_tokens"),
    (dict(top_logprobs=30, logprobs=True), "top_logprobs"), (dict(frequency_penalty=1), "frequency_penalty"),
    (dict(response_format={"type": "json_schema", "json_schema": {}}), "response_format"),
    (dict(messages=[{"role": "assistant", "content": "x"}]), "messages[0]"), (dict(seed="7"), "seed"),
    (dict(stop=17), "stop"),
])
def test_bad_parameters_are_400s_naming_them(server, model_id, kw, param):
    _shape(_post(server, "/v1/chat/completions", _chat(model_id, **kw)), 400, param)


def test_the_openai_client_raises_its_own_errors(server, model_id):
    c = server.client()
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "x"}], n=2)
    assert e.value.status_code == 400 and "n must be 1" in e.value.message
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        list(c.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "x"}], stream=True,
                                       presence_penalty=1.5))


def test_body_problems(server, model_id):
    _shape(_post(server, "/v1/chat/completions", None, raw=b"{not json"), 400)
    _shape(_post(server, "/v1/chat/completions", None, raw=b"[1, 2]"), 400)
    _shape(_post(server, "/v1/chat/completions", None, raw=b"[" * 100000 + b"]" * 100000), 400)
    big = _chat(model_id, messages=[{"role": "user", "content": "x" * (2 << 20)}])
    _shape(_post(server, "/v1/chat/completions", big), 413, code="request_too_large")
    _shape(_post(server, "/v1/chat/completions", _chat("../../../etc/passwd")), 404, "model", "model_not_found")
    _shape(httpx.get(server.base + "/v1/nothing", timeout=10), 404)
    _shape(httpx.get(server.base + "/v1/chat/completions", timeout=10), 405)
    _shape(httpx.get(server.base + "/v1/models/other", timeout=10), 404, code="model_not_found")


def test_a_conversation_longer_than_the_context_is_a_400(server, model_id):
    long = " ".join(["the cat sees the dog"] * 400)
    err = _shape(_post(server, "/v1/chat/completions", _chat(model_id, messages=[{"role": "user", "content": long}])),
                 400, code="context_length_exceeded")
    assert "context" in err["message"]
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": long}, {"role": "user", "content": "b"}]
    _shape(_post(server, "/v1/chat/completions", _chat(model_id, messages=msgs, stream=True)), 400,
           code="context_length_exceeded")
    r = _post(server, "/v1/chat/completions", _chat(model_id))              # the server goes on
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None


@pytest.fixture(scope="module")
def keyed(model_dir, home):
    s = start(runner_for(model_dir), api_key="s3cret-key")
    yield s
    s.close()


def test_with_a_key_every_v1_route_asks_for_it(keyed):
    model_id = keyed.app.state.runner.model_id
    for key in ("wrong", "s3cret-ke", "s3cret-key-and-more"):
        with pytest.raises(openai.AuthenticationError):
            keyed.client(key).models.list()
    _shape(httpx.get(keyed.base + "/v1/models", timeout=10), 401, code="invalid_api_key")
    _shape(_post(keyed, "/v1/chat/completions", _chat(model_id)), 401, code="invalid_api_key")
    _shape(_post(keyed, "/v1/completions", {"model": model_id, "prompt": "x"}, {"Authorization": "Bearer nope"}),
           401)
    assert keyed.client("s3cret-key").models.list().data[0].id == model_id
    r = keyed.client("s3cret-key").chat.completions.create(model=model_id, max_tokens=3,
                                                           messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content is not None
    assert httpx.get(keyed.base + "/health", timeout=10).status_code == 200      # no key: nothing but "ok"


def test_without_a_key_any_key_or_none_is_taken(server, model_id):
    assert server.client("anything").models.list().data[0].id == model_id
    assert httpx.get(server.base + "/v1/models", timeout=10).status_code == 200


def test_serve_without_its_extra_is_one_line_naming_it(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "uvicorn", None)        # import uvicorn -> ImportError
    r = CliRunner().invoke(app, ["serve"])
    assert r.exit_code != 0 and "pip install 'tinychat[serve]'" in str(r.exception)


def test_serve_checks_its_flags_before_loading(tmp_path):
    for args in (["--port", "70000"], ["--max-queue", "0"], ["--quant", "int3"], ["--api-key", " "]):
        r = CliRunner().invoke(app, ["serve", *args])
        assert r.exit_code != 0 and r.exception is not None, args


def test_a_public_bind_without_a_key_is_warned_about(monkeypatch, capsys):
    from tinychat.serve import server as srv
    from tinychat.serve.config import ServeConfig
    ran = []
    monkeypatch.setattr(srv, "build", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("stop here")))
    with pytest.raises(RuntimeError):
        srv.serve(ServeConfig(host="0.0.0.0"), None, "none", "cpu")
    assert "without an API key" in capsys.readouterr().err
    with pytest.raises(RuntimeError):
        srv.serve(ServeConfig(host="0.0.0.0", api_key="k"), None, "none", "cpu")
    with pytest.raises(RuntimeError):
        srv.serve(ServeConfig(), None, "none", "cpu")
    assert "without an API key" not in capsys.readouterr().err and not ran


def test_the_cli_does_not_import_the_server_stack_unless_serve_runs():
    import subprocess
    import sys
    code = ("import sys, tinychat.cli; bad = [m for m in ('starlette', 'uvicorn', 'tinychat.serve.app') "
            "if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
