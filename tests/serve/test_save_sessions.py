"""`--save-sessions DIR`: every request is saved as a session, and `tinychat replay DIR --check` regenerates each
token-exact: new conversations, one that extends the last (cache kept), one that comes back after another (cache
rebuilt, the earlier reply as recorded), replies written by the client, a stop string, a streamed reply."""
import json

from typer.testing import CliRunner

from serve_support import runner_for, start
from tinychat.cli import app


def test_each_request_is_a_session_that_replays_token_exact(model_dir, home, tmp_path):
    folder = tmp_path / "served"
    folder.mkdir()
    s = start(runner_for(model_dir, save_dir=folder))
    try:
        c = s.client()
        m = s.app.state.runner.model_id
        msgs = [{"role": "system", "content": "Be short."}, {"role": "user", "content": "hello there"}]
        a = c.chat.completions.create(model=m, messages=msgs, seed=1, max_tokens=16)
        msgs += [{"role": "assistant", "content": a.choices[0].message.content},
                 {"role": "user", "content": "why the cat?"}]
        b = c.chat.completions.create(model=m, messages=msgs, temperature=0.3, max_tokens=16)   # a random seed
        assert b.usage.prompt_tokens_details.cached_tokens > 0
        c.chat.completions.create(model=m, messages=[{"role": "user", "content": "the moon"}], max_tokens=8,
                                  stop=["e"], extra_body={"phrase_ban": False, "repetition_penalty": 1.0})
        c.chat.completions.create(model=m, messages=msgs, seed=2, max_tokens=16)           # rebuilt
        written = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "I wrote this reply."},
                   {"role": "user", "content": "b"}]
        list(c.chat.completions.create(model=m, messages=written, seed=3, max_tokens=12, stream=True))
        c.completions.create(model=m, prompt="tell me about the sun", max_tokens=10, logprobs=2)
    finally:
        s.close()
    files = sorted(folder.glob("*.json"))
    assert len(files) == 6
    ids = {json.loads(f.read_text())["id"] for f in files}
    assert b.model_extra["tinychat"]["session"] in ids
    r = CliRunner().invoke(app, ["replay", str(folder), "--check", "--model", str(model_dir), "--json"])
    assert r.exit_code == 0, r.output
    results = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(results) == 6 and all(x["ok"] for x in results)
    assert sum(x["turns"] for x in results) == 1 + 2 + 1 + 2 + 2 + 1
