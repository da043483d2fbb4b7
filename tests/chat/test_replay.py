"""Replay: regenerate each turn with its recorded settings and seed; report the first differing token."""
import threading

import pytest

from support import make_chat
from tinychat.sessions import session as S
from tinychat.engine.quant import cpu_has_bf16_dot
from tinychat.chat.replay import replay


def _recorded(turns=3, **kw):
    chat = make_chat(max_new=14, seed=21, **kw)
    for q in ["hello there, tell me a story", "why the cat?", "and the dog?"][:turns]:
        chat.send(q)
    return S.load(chat.session.id)


def test_untouched_session_replays_token_exact():
    sess = _recorded()
    report = replay(make_chat(autosave=False), sess)
    assert report.ok and len(report.turns) == 3
    assert report.n_tokens == sum(len(t.recorded) for t in report.turns) > 20
    assert all(t.tokens == t.recorded for t in report.turns)


def test_replay_reports_a_tampered_token_with_both_probabilities():
    sess = _recorded()
    reply = sess.messages[4]                                   # the second assistant turn
    n_head = len(make_chat().tok.generation_prompt_ids())
    original = reply.token_ids[n_head + 3]
    reply.token_ids[n_head + 3] = (original + 1) % 300
    report = replay(make_chat(autosave=False), sess)
    assert not report.ok
    d = report.divergences[0]
    assert (d.turn, d.position, d.recorded, d.replayed) == (2, 3, (original + 1) % 300, original)
    assert d.p_replayed is not None and d.p_recorded is not None and d.p_replayed > 0
    assert report.turns[0].divergence is None
    assert "turn 2, token 3" in d.describe()


def test_cancelled_turn_replays_the_sampled_prefix():
    chat = make_chat(max_new=100, seed=5)

    def on_token(i, t, text, tr, ms):
        if i == 6:
            threading.Thread(target=chat.cancel).start()

    chat.send("tell me a long story", on_token=on_token)
    chat.send("and then?")
    sess = S.load(chat.session.id)
    assert sess.messages[2].finish == "cancelled"
    assert replay(make_chat(autosave=False), sess).ok


def test_replay_of_a_session_whose_context_was_shortened_is_exact():
    chat = make_chat(max_new=24, seed=3, max_len=150)
    for w in ("cat", "dog", "moon", "sun"):
        chat.send(f"tell me about the {w} and the river")
    sess = S.load(chat.session.id)
    assert any((m.settings or {}).get("context_start") for m in sess.messages if m.role == "assistant")
    assert replay(make_chat(autosave=False, max_len=150), sess).ok


def test_turns_recorded_before_the_reply_ban_existed_replay_without_it():
    chat = make_chat(max_new=40, seed=4, ban_reply=False, temperature=0.0)
    for q in ["hello there, tell me a story", "why the cat?"]:
        chat.send(q)
    sess = S.load(chat.session.id)
    for m in sess.messages:
        if m.settings:
            m.settings.pop("ban_reply")                   # as an older tinychat wrote them
    report = replay(make_chat(autosave=False), sess)     # today's default has the reply ban on
    assert report.ok and report.n_tokens > 20
    # the same turns with the reply ban on would have differed: the setting matters on this model
    again = make_chat(max_new=40, seed=4, ban_reply=True, temperature=0.0, autosave=False)
    assert [again.send(q).text for q in ["hello there, tell me a story", "why the cat?"]] != \
        [m.content for m in sess.messages if m.role == "assistant"]


def test_replay_uses_only_the_public_chat_api():
    """replay.py drives a Chat through start_replay / replay_turn / settings, never its private members."""
    import ast
    import inspect

    import tinychat.chat.replay as R
    tree = ast.parse(inspect.getsource(R))
    private = sorted({n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                      and isinstance(n.value, ast.Name) and n.value.id == "chat" and n.attr.startswith("_")})
    assert private == []


def test_an_int8_session_from_the_step_before_the_native_prefill_is_named_not_called_a_divergence():
    """INT8_STEP_VERSION 3 and later prefill on native kernels (v3 the GEMM, v4 the attention): a session recorded
    by v2 may replay differently, and replay says which steps made and remake it instead of reporting a divergence."""
    from tinychat.engine import native
    if native.load() is None:
        pytest.skip(f"no native kernels here: {native.why_not}")
    v = native.step_version()
    assert v >= 4
    sess = _recorded(turns=1, quant="int8")
    reply = sess.messages[-1]
    assert reply.settings["step"].split("+")[0].split("@")[0] == f"native-int8-v{v}"
    assert replay(make_chat(autosave=False, quant="int8"), sess).ok
    reply.settings["step"] = "native-int8-v2"                 # as recorded before; its tokens rounded otherwise
    n_head = len(make_chat().tok.generation_prompt_ids())
    reply.token_ids[n_head + 1] = (reply.token_ids[n_head + 1] + 1) % 300
    report = replay(make_chat(autosave=False, quant="int8"), sess)
    assert not report.ok and not report.divergences
    assert f"recorded with the native int8 step v2, which this machine does not have (it runs the native int8 step " \
           f"v{v}" in report.step_note()


def test_a_llama_int8_chat_records_the_native_prefill_beside_the_pytorch_decode_step():
    from support import make_llama_model, tokenizer
    from tinychat.engine import EngineOptions, native
    if native.load() is None:
        pytest.skip(f"no native kernels here: {native.why_not}")
    tok = tokenizer()
    names = []
    # a llama the native decode step expresses; one it does not (QK-norm: PyTorch decode after the native
    # prefill GEMM); the kernels off
    for opts, kw in ((EngineOptions(), {}), (EngineOptions(), {"qk_norm": True}), (EngineOptions(native=False), {})):
        m = make_llama_model(vocab_size=tok.vocab_size, **kw)
        m.set_token_strings(tok.token_strings())
        chat = make_chat(m, quant="int8", max_new=4, seed=1, autosave=False, options=opts)
        assert (chat.decoder.cpu_step.nat is None) == bool(kw or not opts.native)
        assert chat.decoder.cpu_step is not None
        chat.send("hello there")
        names.append(chat.session.messages[-1].settings["step"])
    from tinychat.engine.quant import cpu_has_amx
    v, at = native.step_version(), "@" + native.kernel_path()
    off = "torch-int8+bf16-prefill" if cpu_has_bf16_dot() else "torch-int8"   # kernels off: bf16 GEMMs where they run
    # the llama the native step runs gets an fp16 KV cache by default (+kv16); the others keep fp32
    if cpu_has_amx():                           # AMX tiles: bf16 prefill GEMMs whatever the decode step
        assert names == [f"native-int8-v{v}+bf16-prefill+kv16{at}", "torch-int8+bf16-prefill", off]
    else:
        assert names == [f"native-int8-v{v}+kv16{at}", f"torch-int8+native-prefill-v{v}{at}", off]


def test_an_fp16_cache_session_replays_exact_on_its_step_and_is_another_step_on_an_fp32_cache():
    """The fp16 KV cache rounds every attention otherwise: its turns record "+kv16" with the step, replay token-exact
    on a chat with that cache, and are "another step" (not a divergence) on a chat whose cache is fp32."""
    from support import make_llama_model, tokenizer
    from tinychat.engine import EngineOptions, native
    if native.load() is None or native.kernel_path() == "scalar":
        pytest.skip("no native kernels with fp16 conversions here")
    tok = tokenizer()

    def chat(kv):
        m = make_llama_model(vocab_size=tok.vocab_size)
        m.set_token_strings(tok.token_strings())
        # the int8 head alone: the two-level head's int4 tail could hide the cache's rounding in 16 sampled tokens
        return make_chat(m, quant="int8", max_new=8, seed=2, autosave=False,
                         options=EngineOptions(kv_cache=kv, head4=False))

    c16 = chat("auto")
    assert c16.cache.kv16 and "+kv16@" in c16.step_name()
    c16.send("hello there")
    c16.send("and the cat")
    sess = c16.session
    assert all("+kv16@" in m.settings["step"] for m in sess.messages if m.role == "assistant")
    report = replay(chat("fp16"), sess)
    assert report.ok and all(t.tokens == t.recorded for t in report.turns)
    c32 = chat("fp32")
    assert not c32.cache.kv16 and "+kv16" not in c32.step_name()
    report = replay(c32, sess)
    assert not report.ok and not report.divergences and report.step_mismatch
    assert "with an fp16 KV cache" in report.step_note() and "which this machine does not have" in report.step_note()


@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_a_two_level_head_session_replays_exact_on_its_step_and_is_another_step_with_the_int8_head(quant):
    """An int4 (or int8) llama chat scans its logits with the head's int4 copy (engine/two_level_head.py): its turns record "+h4",
    replay token-exact on a chat with the two-level head, and are "another step" on one with the int8 head alone."""
    from support import make_llama_model, tokenizer
    from tinychat.engine import EngineOptions
    tok = tokenizer()

    def chat(on):
        m = make_llama_model(vocab_size=tok.vocab_size)
        m.set_token_strings(tok.token_strings())
        if quant == "int8":             # int8's copy is a stored file's (quantize_cpu's int8_head4), not made at start
            from tinychat.engine import quantize_cpu
            quantize_cpu(m, "int8", options=EngineOptions(head4=on), int8_head4=True)
        return make_chat(m, quant=quant, max_new=8, seed=2, autosave=False, options=EngineOptions(head4=on))

    c4 = chat(True)
    assert "+h4" in c4.step_name()
    c4.send("hello there")
    c4.send("and the cat")
    sess = c4.session
    assert all("+h4" in m.settings["step"] for m in sess.messages if m.role == "assistant")
    report = replay(chat(True), sess)
    assert report.ok and all(t.tokens == t.recorded for t in report.turns)
    c8 = chat(False)
    assert "+h4" not in c8.step_name()
    report = replay(c8, sess)
    assert not report.ok and not report.divergences and report.step_mismatch
    assert "with the two-level int4 head" in report.step_note()


def test_the_step_version_moves_only_on_the_kernel_paths_whose_rounding_changed():
    # v6 changed the AVX2 builds' attention, and moved prefill's attention off SDPA on the AVX-512 builds without
    # VNNI (then named "avx2"); v7 padded the x86 prefill GEMM's long rests of K: a v5 session recorded on NEON or
    # the scalar path still replays as exact; v8 moved the x86 prefill GEMM's short rests of K (NEON: not)
    from tinychat.engine import native
    assert native.INT8_STEP_VERSION == 8
    for path in ("avx2", "avx2-vnni", "avx512", "avx512-vnni"):
        assert native.step_version(path) == 8
    for path in ("neon-dotprod", "neon", "scalar"):
        assert native.step_version(path) == 5
    assert native.step_version() == native.step_version(native.kernel_path())


def test_step_names_describe_the_decode_step_and_the_prefill_gemm():
    from tinychat.chat.replay import describe_step
    assert describe_step("native-int8-v3") == "the native int8 step v3"
    assert describe_step("native-int8-v3+bf16-prefill") == "the native int8 step v3 with bf16 prefill GEMMs"
    assert describe_step("native-int8-v3+fp32-prefill") == "the native int8 step v3 with fp32 prefill GEMMs"
    assert describe_step("torch-int8+native-prefill-v3") == "the PyTorch int8 step after the native int8 prefill v3"
    assert describe_step("torch-int8+bf16-prefill") == "the PyTorch int8 step with bf16 prefill GEMMs"
    assert describe_step("torch-int8") == "the PyTorch int8 step (the fallback: no native kernels)"
    assert describe_step("torch-int8+warp-prefill") == "the int8 step 'torch-int8+warp-prefill'"
    assert describe_step("native-int8-v4+bf16-prefill@avx512-vnni") == \
        "the native int8 step v4 with bf16 prefill GEMMs on avx512-vnni kernels"


def test_a_session_prefilled_with_bf16_gemms_replays_exactly_where_the_native_gemm_is_the_default():
    """A session prefilled with bf16 GEMMs (TINYCHAT_PREFILL_BF16=1, or a build without the native GEMM on a CPU with
    bf16 dot products), replayed where the native int8 GEMM prefills by default: the bf16 GEMMs are available here
    too, so each turn replays on the step it recorded and the session is token-exact (issue #33 item 11; before, it
    was "not comparable"). A token that differs on that step is a divergence."""
    from tinychat.engine import EngineOptions, native
    if native.load() is None:
        pytest.skip(f"no native kernels here: {native.why_not}")
    bf16, gemm = EngineOptions(prefill_bf16=True), EngineOptions(prefill_bf16=False)
    chat = make_chat(quant="int8", max_new=6, seed=3, autosave=False, options=bf16)
    chat.send("hello there")
    chat.send("and the cat")                 # the second turn's prompt is a multi-token prefill
    sess = chat.session
    at = "@" + native.kernel_path()
    recorded = f"native-int8-v{native.step_version()}+bf16-prefill{at}"
    assert sess.messages[-1].settings["step"] == recorded
    assert replay(make_chat(autosave=False, quant="int8", options=bf16), sess).ok
    here = make_chat(autosave=False, quant="int8", options=gemm)
    assert here.step_name() == f"native-int8-v{native.step_version()}{at}"
    report = replay(here, sess)
    assert report.ok and [t.step_here for t in report.turns] == [recorded, recorded]
    assert here.step_name() == f"native-int8-v{native.step_version()}{at}"      # its own step again afterwards
    reply = sess.messages[-1]
    n_head = len(here.tok.generation_prompt_ids())
    reply.token_ids[n_head] = (reply.token_ids[n_head] + 1) % 300
    report = replay(here, sess)
    assert report.divergences and not report.step_mismatch
