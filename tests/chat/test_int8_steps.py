"""Issue #33 item 11: a silent kernel fallback split a session's steps. With the kernel cache removed and the disk
full, turns 6-9 recorded `torch-int8+bf16-prefill` next to turns 1-5's `native-int8-v5`, with no notice, and the
session could then be checked exactly in neither mode. A turn whose step is not the one before it says so in one
line, and replay (and a chat rebuilding its cache) runs each turn on the step it recorded where this machine has it:
the PyTorch step always."""
import pytest
import torch
from support import make_chat, make_chat_model

from tinychat.sessions import session as S
from tinychat.chat.runtime import Chat
from tinychat.engine import native
from tinychat.identity import model_identity
from tinychat.options import EngineOptions
from tinychat.chat.replay import replay_tree

pytestmark = pytest.mark.skipif(native.load() is None, reason=f"no native kernels here ({native.why_not})")
HASH = model_identity(make_chat_model())


def _int8_chat(native_on: bool, session=None, **kw):
    """An int8 chat on its own copy of the model (as another process would have), native kernels on or off."""
    model, options = make_chat_model(), EngineOptions(native=native_on, tune_threads=False)
    if session is not None:
        return Chat.restore(session, model, make_chat().tok, quant="int8", options=options, max_len=512,
                            model_name="tiny-test", model_hash=HASH, **kw)
    return make_chat(model, quant="int8", options=options, max_new=6, seed=3, model_hash=HASH, **kw)


def test_every_step_this_chat_has_can_be_switched_to_and_back():
    chat = _int8_chat(True, autosave=False)
    default = chat.step_name()
    names = chat.steps.available()
    assert default in names and any(n.startswith("torch-int8") for n in names) and len(names) >= 3
    for name in names:
        assert chat.steps.use(name) and chat.step_name() == name
    assert not chat.steps.use("native-int8-v999@nowhere") and chat.step_name() == list(names)[-1]
    assert chat.steps.use(None) and chat.step_name() == default


def test_a_session_whose_steps_changed_replays_exactly_and_says_so_when_it_changes():
    first = _int8_chat(True)
    first.send("hello there")
    first.send("why the cat?")
    first.close()
    sid = first.session.id
    fallback = _int8_chat(False, S.load(sid))          # continued where the kernels are off
    r1 = fallback.send("and the dog?")
    r2 = fallback.send("tell me more")
    fallback.close()
    steps = [(m.settings or {}).get("step") for m in S.load(sid).messages if m.role == "assistant"]
    assert steps[0] == steps[1] != steps[2] == steps[3] and steps[2].startswith("torch-int8")
    assert r1.notice and "the PyTorch int8 step" in r1.notice and "the native int8 step" in r1.notice
    assert "\n" not in r1.notice and r2.notice is None
    for native_on in (True, False):                            # replayed where the kernels run, and where they don't
        [branch] = replay_tree(_int8_chat(native_on, autosave=False), S.load(sid))
        assert branch.report.ok, (native_on, branch.report.step_note(), branch.report.divergences)
        assert [t.step_here for t in branch.report.turns] == steps


def test_a_rebuilt_cache_of_a_mixed_session_is_the_one_the_chat_had():
    first = _int8_chat(True)
    first.send("hello there")
    first.close()
    second = _int8_chat(False, S.load(first.session.id), use_snapshot=False)
    second.send("and the dog?")
    want = {k: v.clone() for k, v in second.cache.state_dict().items()}
    second.close()
    again = _int8_chat(True, S.load(first.session.id), use_snapshot=False, autosave=False)
    got = again.cache.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert again.step_name() == first.step_name()             # the chat's own step for its next turns


@pytest.mark.parametrize("bf16", [False, True], ids=["int4-gemm", "bf16-gemms"])
def test_an_int4_chat_records_its_own_step_and_replays_exactly_on_it(bf16):
    """--quant int4: the turns record "native-int4-v<N>@<path>" (or "torch-int4" without kernels; "+bf16-prefill"
    where long prefills run bf16 GEMMs, as on AMX machines), which replay takes as their own step: exact where this
    machine has it."""
    def chat(native_on, session=None, **kw):
        model = make_chat_model()
        options = EngineOptions(native=native_on, tune_threads=False, prefill_bf16=bf16)
        if session is not None:
            return Chat.restore(session, model, make_chat().tok, quant="int4", options=options, max_len=512,
                                model_name="tiny-test", model_hash=HASH, **kw)
        return make_chat(model, quant="int4", options=options, max_new=6, seed=3, model_hash=HASH, **kw)
    first = chat(True)
    assert first.quant == "int4" and first.step_name() == f"native-int4-v{native.INT4_STEP_VERSION}" \
        f"{'+bf16-prefill' if bf16 else ''}@{native.kernel_path()}"
    assert any(n.startswith("torch-int4") for n in first.steps.available())
    first.send("hello there")
    first.close()
    sid = first.session.id
    later = chat(False, S.load(sid))
    r = later.send("and the dog?")
    later.close()
    assert r.notice and "the PyTorch int4 step" in r.notice and "the native int4 step" in r.notice
    steps = [(m.settings or {}).get("step") for m in S.load(sid).messages if m.role == "assistant"]
    for native_on in (True, False):
        [branch] = replay_tree(chat(native_on, autosave=False), S.load(sid))
        assert branch.report.ok, (native_on, branch.report.step_note(), branch.report.divergences)
        assert [t.step_here for t in branch.report.turns] == steps
