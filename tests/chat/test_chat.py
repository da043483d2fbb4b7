"""The chat runtime: turns on one cache, phrase ban, penalty, trace, stop, undo/regenerate, context-full, restore."""
import threading

import pytest
import torch

from support import make_chat, make_chat_model, tokenizer
from tinychat.sessions import session as S
from tinychat.chat.runtime import Chat, ChatError, ChatSettings
from tinychat.sampler import DEAD_END_MIN_MASS, TurnHook, ngram_table, penalty_ids


def _cache(chat):
    c = chat.cache
    L = int(c.lens_cpu[0])
    return (L, c.gk[:, 0, :, :L].clone(), c.lk.clone(), c.lpos.clone(), c.tokens[0, :L].clone())


def _same_cache(a, b):
    return a[0] == b[0] and all(torch.equal(x, y) for x, y in zip(a[1:], b[1:]))


def test_turn_appends_only_new_tokens_and_records_the_session():
    chat = make_chat(max_new=12, seed=1)
    r1 = chat.send("hello there, tell me a story")
    L1 = int(chat.cache.lens_cpu[0])
    r2 = chat.send("why the cat?")
    tok = tokenizer()
    # turn 2 fed: the newline after <|im_end|> + the user message + the generation prompt, nothing more
    assert r2.prefill_tokens == 1 + len(tok.message_ids("user", "why the cat?")) + len(tok.generation_prompt_ids())
    assert int(chat.cache.lens_cpu[0]) == L1 + r2.prefill_tokens + r2.n_tokens + 1
    msgs = chat.session.messages
    assert [m.role for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
    assert msgs[2].seed == 1 and msgs[2].settings["temperature"] == ChatSettings().temperature
    # the cache holds exactly the conversation's tokens (minus the pending newline)
    ids = chat.session.context_ids()
    assert chat.cache.tokens[0, :len(ids) - 1].tolist() == ids[:-1]
    assert r1.finish in ("stop", "length") and r1.text == tok.decode(r1.token_ids, skip_special=True)
    saved = S.load(chat.session.id)
    assert saved.n_turns == 2 and saved.messages[-1].token_ids == msgs[-1].token_ids


def test_stream_pieces_concatenate_to_the_reply_text():
    chat = make_chat(max_new=30, seed=2)
    pieces = []
    r = chat.send("tell me about the river", on_token=lambda i, t, text, tr, ms: pieces.append(text))
    assert "".join(pieces) == r.text and len(pieces) >= r.n_tokens


def test_same_seed_same_reply_and_different_seeds_differ():
    a = make_chat(max_new=20, seed=5).send("hello")
    b = make_chat(max_new=20, seed=5).send("hello")
    c = make_chat(max_new=20, seed=6).send("hello")
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids


def test_ban_table_holds_earlier_replies_and_the_user_message():
    tbl = ngram_table([[1, 2, 3, 4], [2, 3, 5]])
    assert tbl == {(1, 2): [3], (2, 3): [4, 5]}
    user = tokenizer().encode("the cat sees the dog")
    for no_parrot in (True, False):
        chat = make_chat(max_new=15, seed=3, temperature=0.0, no_parrot=no_parrot)
        captured = {}
        orig = chat.decoder.generate

        def spy(*a, **kw):
            captured["hook"] = kw["logits_hook"]
            return orig(*a, **kw)

        chat.decoder.generate = spy
        r1 = chat.send("the cat sees the dog")
        chat.send("the cat sees the dog")
        table = captured["hook"].table
        reply = r1.token_ids
        for i in range(len(reply) - 2):                       # every 3-gram of the earlier reply is banned
            assert reply[i + 2] in table[(reply[i], reply[i + 1])]
        # no-parrot (off by default): the user's own 3-grams too
        assert (user[2] in table.get((user[0], user[1]), [])) == no_parrot


def test_eager_ban_never_samples_a_banned_trigram():
    chat = make_chat(max_new=40, seed=3, temperature=0.0, penalty=1.0)
    first = chat.send("the cat sees the dog")
    second = chat.send("the cat sees the dog", trace=True)
    assert second.stats.banned_steps > 0
    grams = {tuple(first.token_ids[i:i + 3]) for i in range(len(first.token_ids) - 2)}
    lifted = {tr.index for tr in second.traces if tr.lifted}
    for i in range(2, len(second.token_ids)):
        if i not in lifted:
            assert tuple(second.token_ids[i - 2:i + 1]) not in grams


def test_graph_path_ban_equals_the_eager_ban():
    # the static device loop matches the same table on the device (no dead-end guard there: greedy, no lifts)
    outs = []
    for graph in (False, "static"):
        chat = make_chat(max_new=30, seed=3, temperature=0.0, penalty=1.0, graph=graph)
        chat.send("the cat sees the dog")
        r = chat.send("the cat sees the dog")
        outs.append((r.mode, r.token_ids, r.stats))
    assert [o[0] for o in outs] == ["eager", "static"]
    assert outs[0][2].lifts == 0 and outs[0][2].banned_steps > 0
    assert outs[0][1] == outs[1][1]


def test_dead_end_guard_lifts_a_ban_that_would_remove_almost_all_mass():
    logits = torch.full((1, 10), -10.0)
    logits[0, 4] = 10.0                                  # token 4 holds ~all the mass
    hook = TurnHook({(1, 2): [4]}, temperature=1.0, top_p=1.0, pen=1.0, pen_ids=[], stop=9)
    out = hook([1, 2], logits)
    assert torch.equal(out, logits) and hook.stats.lifts == 1
    logits[0, 5] = 10.0                                  # now half the mass survives the ban
    out = hook([1, 2], logits)
    assert out[0, 4] == float("-inf") and hook.stats.banned_steps == 1
    assert 1 - 0.5 > DEAD_END_MIN_MASS


def test_penalty_window_covers_recent_content_only():
    assert penalty_ids([5, 6, 7, 8, 9], 3) == [7, 8, 9]
    assert penalty_ids([5, 6, 7, 8, 9], 3, exclude={8}) == [7, 9]
    assert penalty_ids([5, 6], 0) == []
    chat = make_chat(max_new=10, seed=4, penalty=1.5, penalty_window=4)
    r = chat.send("the cat sees the dog", trace=True)
    assert r.stats.penalised == len(set(tokenizer().encode("the cat sees the dog")[-4:]))
    marked = {c.token for tr in r.traces for c in tr.candidates if c.penalised}
    assert marked <= set(tokenizer().encode("the cat sees the dog")[-4:])


def test_trace_records_rank_and_probabilities_of_each_token():
    chat = make_chat(max_new=15, seed=8, temperature=0.0)
    r = chat.send("hello", trace=True)
    assert len(r.traces) == len(r.token_ids) + (r.finish == "stop")
    for tr, t in zip(r.traces, r.token_ids):
        assert tr.token == t and tr.rank == 0                     # greedy: always the top candidate
        assert abs(tr.p_final - max(c.p_final for c in tr.candidates)) < 1e-6
    untraced = make_chat(max_new=15, seed=8, temperature=0.0).send("hello")
    assert untraced.traces == [] and untraced.token_ids == r.token_ids


def test_stop_mid_turn_leaves_a_well_formed_cache():
    chat = make_chat(max_new=200, seed=9)

    def on_token(i, t, text, tr, ms):
        if i == 4:
            threading.Thread(target=chat.cancel).start()

    r = chat.send("tell me a long story", on_token=on_token)
    assert r.finish == "cancelled" and 4 <= r.n_tokens < 200
    L = int(chat.cache.lens_cpu[0])
    assert int(chat.cache.tokens[0, L - 1]) == tokenizer().im_end      # the turn ends in <|im_end|>
    live = chat.send("and then?")
    rebuilt = Chat.restore(chat.session.id, make_chat_model(), tokenizer(), use_snapshot=False, max_len=512)
    rebuilt.undo()
    assert _same_cache(_cache(rebuilt), _cache_after_undo(chat))
    assert live.text


def _cache_after_undo(chat):
    chat.undo()
    return _cache(chat)


def test_undo_equals_a_chat_that_never_had_the_turn():
    a = make_chat(max_new=12, seed=2)
    a.send("hello there")
    before = _cache(a)
    a.send("why the cat?")
    user = a.undo()
    assert user.content == "why the cat?" and a.session.n_turns == 1
    assert _same_cache(_cache(a), before)
    b = make_chat(max_new=12, seed=2)
    b.send("hello there")
    assert a.send("and the dog?").token_ids == b.send("and the dog?").token_ids


def test_regenerate_equals_a_fresh_turn_with_the_same_seed():
    a = make_chat(max_new=12, seed=2)
    a.send("hello there")
    a.send("why the cat?")
    a.set("seed", "77")
    r = a.regenerate()
    b = make_chat(max_new=12, seed=2)
    b.send("hello there")
    b.set("seed", "77")
    assert r.token_ids == b.send("why the cat?").token_ids
    assert a.session.n_turns == 2 and a.session.messages[-1].seed == 77


def test_nothing_to_undo_is_a_clear_error():
    with pytest.raises(ChatError, match="no turn"):
        make_chat().undo()


def test_context_full_drops_oldest_turns_and_keeps_the_system_prompt():
    chat = make_chat(max_new=24, seed=3, max_len=150)
    results = [chat.send(f"tell me about the {w} and the river") for w in ("cat", "dog", "moon", "sun", "fish")]
    assert any(r.dropped_turns for r in results)
    assert int(chat.cache.lens_cpu[0]) <= 150
    sys_ids = chat.session.messages[0].token_ids
    assert chat.cache.tokens[0, :len(sys_ids)].tolist() == sys_ids
    # the whole history stays in the session; a restore rebuilds the same shortened cache
    assert chat.session.n_turns == 5
    again = Chat.restore(chat.session.id, make_chat_model(), tokenizer(), use_snapshot=False, max_len=150)
    assert _same_cache(_cache(again), _cache(chat))
    # undo across a shortening turn rebuilds rather than truncates
    chat.undo()
    assert int(chat.cache.lens_cpu[0]) <= 150


def test_message_too_long_for_the_context_is_a_clear_error():
    chat = make_chat(max_new=20, max_len=64)
    with pytest.raises(ChatError, match="too long"):
        chat.send("the cat " * 40)
    assert chat.session.n_turns == 0 and int(chat.cache.lens_cpu[0]) == 0


@pytest.mark.parametrize("use_snapshot", [False, True], ids=["re-prefill", "snapshot"])
def test_restore_continues_token_exact(use_snapshot):
    live = make_chat(max_new=16, seed=11)
    live.send("hello there")
    live.send("why the cat?")
    live.set("seed", "99")
    expected = live.send("and the dog?")

    saved = make_chat(max_new=16, seed=11)
    saved.send("hello there")
    saved.send("why the cat?")
    restored = Chat.restore(saved.session.id, make_chat_model(), tokenizer(), use_snapshot=use_snapshot,
                            max_len=512)
    assert restored.used_snapshot == use_snapshot
    assert _same_cache(_cache(restored), _cache(saved))
    restored.set("seed", "99")
    assert restored.send("and the dog?").token_ids == expected.token_ids


def test_restore_with_another_model_is_a_clear_error():
    chat = make_chat(max_new=10, seed=1)
    chat.send("hello there")
    other = make_chat_model(seed=1)
    with pytest.raises(ChatError, match=r"another model \(tiny-test\)"):
        Chat.restore(chat.session.id, other, tokenizer(), max_len=512)
    # the same name on other weights (a model updated or imported again since): said so, with both identities
    with pytest.raises(ChatError, match=r"another version of the model 'tiny-test' \(weights [0-9a-f]{12}, this one "
                                        r"[0-9a-f]{12}\); load that model"):
        Chat.restore(chat.session.id, other, tokenizer(), max_len=512, model_name="tiny-test")


def test_a_session_of_another_model_is_named_as_such_before_its_token_ids_are_checked():
    """Another model's ids can be outside this one's vocabulary (SmolLM2's 49,152 against the shipped 8,192): that is
    the model's difference, not a broken file, and the error says which model the session needs."""
    from support import make_model
    from tinychat.settings import OtherModel
    chat = make_chat(max_new=4, seed=1)                  # the 400-token tiny chat model, "tiny-test"
    chat.send("hello there, tell me about the cat")
    chat.close()
    ids = [t for m in chat.session.messages for t in m.token_ids]
    small = make_model(vocab_size=300)                   # the same tokenizer's first 300 ids only
    assert max(ids) >= 300
    with pytest.raises(OtherModel, match=r"recorded with another model \(tiny-test\); load that model") as e:
        Chat.restore(chat.session.id, small, tokenizer(), max_len=512, model_name="small")
    assert e.value.model_name == "tiny-test" and e.value.session_id == chat.session.id and not e.value.same_name
    # the same model by name and identity: then an id outside its vocabulary is a broken file, named as such
    with pytest.raises(S.SessionError, match=r"token_ids\[\d+\] = \d+ is outside the model's vocabulary"):
        Chat.restore(chat.session.id, small, tokenizer(), max_len=512, model_name="tiny-test",
                     model_hash=chat.model_hash)


def test_settings_parse_and_validate():
    st = ChatSettings()
    assert st.with_value("temperature", "0.3").temperature == 0.3
    assert st.with_value("ban", "off").ban is False
    assert st.with_value("max-new", "12").max_new == 12
    assert st.with_value("seed", "random").seed is None
    for key, value, msg in [("temperature", "hot", "cannot read"), ("top-p", "2", "between"),
                            ("colour", "red", "unknown setting"), ("ban", "maybe", "cannot read")]:
        with pytest.raises(ChatError, match=msg):
            st.with_value(key, value)


def test_system_prompt_change_before_the_first_turn_replaces_it():
    chat = make_chat()
    chat.set("system", "Be brief.")
    assert chat.session.messages[0].content == "Be brief."
    chat.send("hello")
    chat.set("system", "Be long.")
    assert chat.session.messages[0].content == "Be brief."       # the history keeps what it was prefilled with


def test_unusable_snapshot_falls_back_to_an_exact_re_prefill():
    chat = make_chat(max_new=10, seed=1)
    chat.send("hello there")
    S.snapshot_path(chat.session.id).write_bytes(b"garbage")
    again = Chat.restore(chat.session.id, make_chat_model(), tokenizer(), max_len=512)
    assert not again.used_snapshot and _same_cache(_cache(again), _cache(chat))
    chat.save()                                          # a good snapshot, but of an fp32 cache: int8 ignores it
    q = Chat.restore(chat.session.id, make_chat_model(), tokenizer(), quant="int8", max_len=512)
    assert not q.used_snapshot and q.quant == "int8" and int(q.cache.lens_cpu[0]) == int(chat.cache.lens_cpu[0])


def test_static_loop_traces_and_streams_like_the_eager_loop():
    runs = []
    for graph in (False, "static"):
        chat = make_chat(max_new=30, seed=3, temperature=0.0, penalty=1.0, graph=graph)
        chat.send("the cat sees the dog")
        pieces = []
        r = chat.send("the cat sees the dog", trace=True, on_token=lambda i, t, text, tr, ms: pieces.append(t))
        runs.append((r, pieces))
    (e, ep), (s, sp) = runs
    assert s.mode == "static" and e.token_ids == s.token_ids and e.stats.lifts == 0
    assert [t for t in sp if t >= 0] == s.token_ids == [t for t in ep if t >= 0]
    assert len(e.traces) == len(s.traces) and s.stats.banned_steps == e.stats.banned_steps > 0
    for a, b in zip(e.traces, s.traces):
        assert (a.token, a.rank, a.banned) == (b.token, b.rank, b.banned)
        assert abs(a.p_final - b.p_final) < 1e-4
        assert [c.token for c in a.candidates][:3] == [c.token for c in b.candidates][:3]


def test_stop_mid_turn_in_the_static_loop_leaves_a_well_formed_cache():
    chat = make_chat(max_new=120, seed=10, graph="static")      # this seed runs to max_new when left alone

    def on_token(i, t, text, tr, ms):
        if i == 3:
            chat.cancel()

    r = chat.send("tell me a long story", on_token=on_token)
    assert r.finish == "cancelled" and r.n_tokens < 120
    L = int(chat.cache.lens_cpu[0])
    assert int(chat.cache.tokens[0, L - 1]) == tokenizer().im_end
    again = Chat.restore(chat.session.id, make_chat_model(), tokenizer(), use_snapshot=False, max_len=512,
                         graph="static")
    assert _same_cache(_cache(again), _cache(chat))


def test_a_second_chat_with_another_quant_is_refused_not_given_the_first_ones_mode():
    from tinychat.engine import int8_kernel_ok
    m = make_chat_model()
    first = make_chat(m, quant="bf16", autosave=False)
    assert first.quant == "bf16" and first.decoder.mode == "fast-bf16"
    with pytest.raises(ChatError, match="already loaded as --quant bf16"):
        make_chat(m, quant="none", autosave=False)
    if int8_kernel_ok():
        with pytest.raises(ChatError, match="already loaded as --quant bf16"):
            make_chat(m, quant="int8", autosave=False)
    again = make_chat(m, quant="bf16", autosave=False)        # the same mode: the shared model as it is
    as_is = make_chat(m, autosave=False)                      # quant None: whatever the model is
    assert again.quant == as_is.quant == "bf16" and as_is.decoder.mode == "fast-bf16"


def test_chat_options_reach_its_decoder_and_the_quantized_layers():
    from tinychat.engine import EngineOptions
    opts = EngineOptions(native=False, prefill_bf16=False)
    chat = make_chat(quant="int8", autosave=False, options=opts)
    assert chat.decoder.options is opts
    assert chat.decoder.cpu_step is not None and chat.decoder.cpu_step.nat is None
    assert chat.model.blocks[0].mlp.up.prefill_bf16 is False
    r = chat.send("hello there", trace=False)
    assert r.mode in ("fast-int8", "fast-bf16") and r.n_tokens > 0


def test_an_int8_turn_records_which_step_made_it():
    from tinychat.engine import native
    from tinychat.options import EngineOptions
    chat = make_chat(quant="int8", max_new=4, seed=1, autosave=False)
    chat.send("hello there")
    step = chat.session.messages[-1].settings["step"]
    from tinychat.engine.quant import cpu_has_bf16_dot
    from tinychat.engine.quant import cpu_has_amx
    bf16 = "+bf16-prefill" if cpu_has_bf16_dot() else ""    # kernels off: bf16 prefill GEMMs where the CPU has them
    if native.load() is not None:               # on: prefill on the native int8 GEMM (bf16 GEMMs on AMX machines)
        amx = "+bf16-prefill" if cpu_has_amx() else ""
        assert step == f"native-int8-v{native.step_version()}{amx}@{native.kernel_path()}"
    else:
        assert step == f"torch-int8{bf16}"
    off = make_chat(quant="int8", max_new=4, seed=1, autosave=False, options=EngineOptions(native=False))
    off.send("hello there")
    assert off.session.messages[-1].settings["step"] == f"torch-int8{bf16}"
