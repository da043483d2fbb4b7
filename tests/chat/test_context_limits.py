"""Issue #33's "Also" items on limits: a session file's model.max_len is validated (-5, 1.5, true and [1] gave
errors from inside torch), `/set max-new` must fit the context (100000 on a 2,048-token model was taken and every
later turn failed with a misleading "system prompt too long"), `bench --threads 0` ran while a chat refused it, and
the other counts a flag takes are bounded the same way."""
import json
import re

import pytest
from support import make_chat, run_main

from tinychat.sessions import session as S
from tinychat.chat.ab import run_ab
from tinychat.bench import run_bench
from tinychat.settings import ChatError


@pytest.mark.parametrize("value", [-5, 0, 1.5, True, [1], "512", 10 ** 9])
def test_a_session_files_context_length_must_be_a_position_count(value):
    chat = make_chat(max_new=4, seed=1)
    chat.send("hello there")
    chat.close()
    path = S.session_path(chat.session.id)
    d = json.loads(path.read_text())
    d["model"]["max_len"] = value
    path.write_text(json.dumps(d))
    with pytest.raises(S.SessionError) as e:
        S.load(chat.session.id)
    assert "model.max_len must be an integer in 1..131072" in str(e.value) and "\n" not in str(e.value)


def test_set_max_new_beyond_the_context_is_refused_and_a_fitting_one_works():
    chat = make_chat(max_new=4, seed=1, max_len=512, autosave=False)
    with pytest.raises(ChatError, match="max-new 100,000 does not fit the 512-token context: at most"):
        chat.set("max-new", "100000")
    assert chat.settings.max_new == 4
    room = chat.max_new_room()
    chat.set("max-new", str(room))
    chat.set("max-new", "8")
    chat.send("hello there")
    with pytest.raises(ChatError, match="max-new 5,000 does not fit"):
        run_ab(chat, {"max-new": "5000"})


def test_a_reply_too_long_for_this_message_names_max_new_not_the_system_prompt():
    chat = make_chat(max_new=500, seed=1, max_len=512, autosave=False)
    with pytest.raises(ChatError) as e:
        chat.send("hello there, " * 10)
    assert str(e.value).startswith("max-new 500 is too large for this message") and "/set max-new" in str(e.value)


@pytest.mark.parametrize("who", ["message", "system prompt"])
def test_a_turn_too_long_for_the_context_says_its_counts_with_thousands_separators(who):
    long = "the cat sees the dog " * 300                                 # over 1,000 tokens
    system, message = (long, "hi") if who == "system prompt" else (None, long)
    chat = make_chat(max_new=4, seed=1, max_len=512, autosave=False, **({"system_prompt": system} if system else {}))
    with pytest.raises(ChatError) as e:
        chat.send(message)
    text = str(e.value)
    assert text.startswith(f"{who} too long") and re.search(r"\b\d{1,3}(,\d{3})+ tokens", text), text
    assert not re.search(r"\d{4}", text), text                          # no count printed bare


def test_a_max_new_flag_no_turn_could_hold_is_refused_before_the_first_turn(capsys, tmp_path):
    from support import make_chat_model, tokenizer
    make_chat_model().save_pretrained(tmp_path / "m")
    tokenizer().save(tmp_path / "m" / "tokenizer.json")
    code, out, err = run_main(["--model", tmp_path / "m", "--max-new", "100000", "-p", "hi"], capsys)
    assert code == 2 and "max-new 100,000 does not fit the 512-token context" in err and err.count("\n") == 1


@pytest.mark.parametrize("args, words", [
    (["bench", "--config", "tiny", "--threads", "0"], "--threads must be between 1 and"),
    (["bench", "--config", "tiny", "--threads", "-3"], "--threads must be between 1 and"),
    (["--threads", "100000", "-p", "hi"], "--threads must be between 1 and"),
    (["replay", "nope", "--speed", "-1"], "--speed must be 0"),
    (["replay", "nope", "--speed", "nan"], "--speed must be 0"),
])
def test_counts_out_of_range_are_refused_in_one_line(capsys, args, words):
    code, _, err = run_main(args, capsys)
    assert code == 2 and words in err and err.count("\n") == 1


def test_the_benchmark_library_refuses_zero_threads_too():
    with pytest.raises(ValueError, match="--threads must be between 1"):
        run_bench(None, "tiny", "none", "cpu", 8, 4, 1, threads=0)


def test_an_import_context_beyond_the_positions_ceiling_is_refused(tmp_path):
    from tinychat.importer import ImportRefused, import_model
    with pytest.raises(ImportRefused, match="--context must be between 16 and 131,072"):
        import_model(tmp_path, name="x", context=10 ** 9)
