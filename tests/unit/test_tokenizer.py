"""Tokenizer wrapper: ChatML framing, streaming detokenization, token views, training, load errors."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers, trainers
from work import lines_run

from tinychat.tokenizer import IM_END, IM_START, StreamDecoder, Tokenizer, TokenizerError, train_bpe

WORDS = (
    "the a cat Cat dog sat on mat and ran to house was small big very happy tree "
    "猫 犬 日本 😀 🎉 héllo naïve Ａ"
).split()


def corpus(n: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) + "." for _ in range(n)]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return train_bpe(corpus(), vocab_size=400)


# Text the tokenizer never saw: its multi-byte characters stay split into single-byte tokens.
UNSEEN = "中文字符 🐍 ∑ Ωμέγα ok"


# -- training and basics -----------------------------------------------------------------------------------------


def test_train_bpe_trains_in_the_library_not_in_python_and_registers_chatml_specials():
    texts = corpus(300, seed=1)
    tok, _ = lines_run(lambda: train_bpe(texts, vocab_size=350), budget=500)    # ~55 lines: the merges run in Rust
    assert (tok.hf.token_to_id("<|endoftext|>"), tok.im_start, tok.im_end) == (0, 1, 2)
    assert tok.endoftext == 0
    assert tok.eos_id == tok.im_end
    assert 259 < tok.vocab_size <= 350
    assert {0, 1, 2} <= tok.special_ids


def test_train_bpe_saves_when_given_a_path(tmp_path):
    path = tmp_path / "tokenizer.json"
    tok = train_bpe(corpus(50), vocab_size=300, path=path)
    again = Tokenizer.from_file(path)
    assert again.encode("the cat sat") == tok.encode("the cat sat")
    assert again.sha256 == tok.sha256


def test_train_bpe_rejects_a_vocab_smaller_than_bytes_plus_specials():
    with pytest.raises(TokenizerError, match="at least 259"):
        train_bpe(corpus(10), vocab_size=100)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=60))
def test_encode_decode_round_trips_any_text(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text


def test_encode_keeps_special_token_text_as_plain_text(tok):
    text = f"say {IM_END} and {IM_START}user please"
    ids = tok.encode(text)
    assert tok.im_end not in ids and tok.im_start not in ids
    assert tok.decode(ids) == text


def test_encode_with_allow_special_maps_special_strings_to_their_ids(tok):
    ids = tok.encode(f"hi{IM_END}\n{IM_START}x", allow_special=True)
    assert ids.count(tok.im_end) == 1 and ids.count(tok.im_start) == 1
    assert ids.index(tok.im_end) < ids.index(tok.im_start)
    assert tok.decode(ids) == f"hi{IM_END}\n{IM_START}x"


def test_from_str_to_str_round_trip_preserves_the_tokenizer(tok):
    again = Tokenizer.from_str(tok.to_str())
    assert again.encode(UNSEEN + " the cat") == tok.encode(UNSEEN + " the cat")
    assert again.vocab_size == tok.vocab_size
    assert again.sha256 == tok.sha256


# -- ChatML --------------------------------------------------------------------------------------------------------

CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "the cat sat 😀"},
    {"role": "assistant", "content": "  leading spaces\nand lines\n"},
    {"role": "user", "content": ""},
]


def test_format_messages_produces_exact_chatml(tok):
    ids = tok.format_messages(CHAT[:2])
    expected = (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nthe cat sat 😀<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tok.decode(ids) == expected
    assert Tokenizer.format_text(CHAT[:2]) == expected
    assert ids[0] == tok.im_start and ids.count(tok.im_start) == 3 and ids.count(tok.im_end) == 2


def test_format_messages_without_generation_prompt_ends_after_the_last_message(tok):
    ids = tok.format_messages(CHAT[:2], add_generation_prompt=False)
    assert tok.decode(ids).endswith("the cat sat 😀<|im_end|>\n")
    assert ids[-len(tok.end_ids()):] == tok.end_ids()


def test_message_ids_concatenate_to_format_messages(tok):
    pieces = [tok.message_ids(m["role"], m["content"]) for m in CHAT]
    joined = [t for p in pieces for t in p] + tok.generation_prompt_ids()
    assert joined == tok.format_messages(CHAT)
    # An assistant message is the generation prompt, its content, then <|im_end|>\n: the shape a runtime
    # produces when it samples the content instead of encoding it.
    assert tok.message_ids("assistant", "ok") == tok.generation_prompt_ids() + tok.encode("ok") + tok.end_ids()
    assert tok.end_ids()[0] == tok.eos_id


def test_format_messages_rejects_unknown_roles_and_bad_messages(tok):
    with pytest.raises(ValueError, match="unknown role"):
        tok.format_messages([{"role": "robot", "content": "x"}])
    with pytest.raises(ValueError, match="content must be a string"):
        tok.format_messages([{"role": "user", "content": 3}])
    with pytest.raises(ValueError, match="message 0"):
        tok.format_messages([{"content": "x"}])


# -- streaming -----------------------------------------------------------------------------------------------------


def stream(tok: Tokenizer, ids: list[int], **kw) -> list[str]:
    dec = StreamDecoder(tok, **kw)
    return [dec.push(i) for i in ids] + [dec.flush()]


def test_stream_decoder_never_splits_a_utf8_character(tok):
    ids = tok.encode(UNSEEN)
    # The test is only meaningful if some tokens really hold part of a character.
    partial = [i for i in ids if "\ufffd" in tok.decode([i])]
    assert len(partial) >= 6
    pieces = stream(tok, ids)
    assert all("\ufffd" not in p for p in pieces)
    assert sum(1 for p in pieces if p == "") >= 4  # held back while characters were incomplete
    assert "".join(pieces) == UNSEEN == tok.decode(ids)


def test_stream_decoder_emits_ascii_as_soon_as_it_arrives(tok):
    ids = tok.encode("the cat sat on the mat")
    pieces = stream(tok, ids)
    assert all(pieces[:-1]) and pieces[-1] == ""
    assert "".join(pieces) == "the cat sat on the mat"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_stream_decoder_concatenation_equals_decode_for_any_ids(tok, data):
    # Any id sequence, including invalid byte orders and special tokens.
    ids = data.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=40))
    skip = data.draw(st.booleans())
    assert "".join(stream(tok, ids, skip_special=skip)) == tok.decode(ids, skip_special=skip)


def test_stream_decoder_flush_resets_for_the_next_turn(tok):
    dec = StreamDecoder(tok)
    first = "".join(dec.push(i) for i in tok.encode("中")) + dec.flush()
    second = "".join(dec.push(i) for i in tok.encode("ok 🐍")) + dec.flush()
    assert (first, second) == ("中", "ok 🐍")


def test_stream_decoder_flush_surfaces_an_unfinished_character(tok):
    dec = StreamDecoder(tok)
    first_byte = tok.encode("中")[0]
    assert dec.push(first_byte) == ""
    assert dec.flush() == "\ufffd"


# -- token views ---------------------------------------------------------------------------------------------------


def test_token_strings_show_text_and_keep_partial_utf8_tokens_distinct(tok):
    strings = tok.token_strings()
    assert len(strings) == tok.vocab_size
    (cat,) = tok.encode(" cat")
    assert strings[cat] == " cat"
    assert strings[tok.im_end] == IM_END
    # 中 = E4 B8 AD: unseen, so its first two bytes are separate tokens; each shows its own byte.
    b0, b1, _ = tok.encode("中")
    assert (strings[b0], strings[b1]) == ("\\xe4", "\\xb8")


def test_canonical_ids_merge_case_nfkc_and_leading_space_variants(tok):
    strings = tok.token_strings()
    ids = {s: i for i, s in enumerate(strings)}
    cids = tok.canonical_ids()
    assert len(cids) == tok.vocab_size
    variants = [ids[s] for s in ("cat", " cat", "Cat", " Cat") if s in ids]
    assert len(variants) >= 3
    assert {cids[i] for i in variants} == {min(variants)}
    letters = [ids["Ａ"], ids["A"], ids["a"]]  # NFKC('Ａ') == 'A', lowercased 'a'
    assert {cids[i] for i in letters} == {min(letters)}
    # Tokens with no look-alike keep their own id.
    assert cids[tok.im_end] == tok.im_end
    assert cids[ids["\\xe4"]] == ids["\\xe4"]
    assert cids[ids[" dog"]] != cids[ids[" cat"]]


# -- load errors ---------------------------------------------------------------------------------------------------


def assert_one_line_naming(err: pytest.ExceptionInfo, path) -> None:
    message = str(err.value)
    assert "\n" not in message
    assert str(path) in message


def test_missing_tokenizer_file_raises_tokenizer_error(tmp_path):
    path = tmp_path / "nope" / "tokenizer.json"
    with pytest.raises(TokenizerError, match="not found") as err:
        Tokenizer.from_file(path)
    assert_one_line_naming(err, path)


@pytest.mark.parametrize(
    "content, why",
    [
        ("", "not valid JSON"),
        ('{"version": "1.0", "model": ', "not valid JSON"),
        ("[1, 2, 3]", "not a Hugging Face tokenizer.json"),
        ('{"hello": "world"}', "not a Hugging Face tokenizer.json"),
    ],
)
def test_malformed_tokenizer_file_raises_tokenizer_error(tmp_path, content, why):
    path = tmp_path / "tokenizer.json"
    path.write_text(content)
    with pytest.raises(TokenizerError, match=why) as err:
        Tokenizer.from_file(path)
    assert_one_line_naming(err, path)


def test_tokenizer_without_chatml_specials_raises_tokenizer_error(tmp_path):
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=280, special_tokens=["<|endoftext|>"], show_progress=False)
    hf.train_from_iterator(corpus(30), trainer)
    path = tmp_path / "tokenizer.json"
    path.write_text(hf.to_str())
    missing = re.escape("lacks the ChatML special token(s) <|im_start|>, <|im_end|>")
    with pytest.raises(TokenizerError, match=missing) as err:
        Tokenizer.from_file(path)
    assert_one_line_naming(err, path)


def test_non_utf8_tokenizer_file_raises_tokenizer_error(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(b'{"x": "\xff\xfe"}')
    with pytest.raises(TokenizerError, match="cannot read") as err:
        Tokenizer.from_file(path)
    assert_one_line_naming(err, path)


def test_tokenizer_error_is_a_value_error():
    assert issubclass(TokenizerError, ValueError)


def test_content_ids_strip_the_chatml_frame_of_every_role(tok):
    for role in ("system", "user", "assistant"):
        body = tok.encode("the cat sees the moon")
        assert tok.content_ids(role, tok.message_ids(role, "the cat sees the moon")) == body
    reply = tok.generation_prompt_ids() + [5, 6, 7] + tok.end_ids()
    assert tok.content_ids("assistant", reply) == [5, 6, 7]
