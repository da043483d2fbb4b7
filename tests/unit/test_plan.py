"""The execution plan is decided once (plan.decide, from loading) and handed down: a Chat given one runs a turn
without asking the model's Linear classes, the kernels or the prefill GEMM again, and names the step the plan says."""
import pytest
from support import make_chat_model, tokenizer

from tinychat.chat.runtime import Chat, ChatSettings
from tinychat.engine import native
from tinychat.options import EngineOptions
from tinychat.plan import ExecutionPlan, decide, step_name


def test_a_chat_given_a_plan_does_not_derive_it_again(monkeypatch):
    model = make_chat_model()
    plan = decide(model, "int8", "cpu", EngineOptions(tune_threads=False))
    assert plan.quant == "int8" and plan.int8_cpu and plan.threads >= 1

    def asked(*a, **k):
        raise AssertionError("re-derived below the plan")
    import tinychat.engine.cpu_step as cpu_step
    import tinychat.engine.native as native_mod
    import tinychat.engine.quant as quant
    for mod, name in ((cpu_step, "quant_mode"), (quant, "quant_mode"), (quant, "effective_mode"),
                      (native_mod, "step_version")):
        monkeypatch.setattr(mod, name, asked)
    chat = Chat(model, tokenizer(), ChatSettings(max_new=4, seed=1), plan=plan, autosave=False, max_len=256)
    r = chat.send("hello there")
    assert r.n_tokens > 0 and chat.quant == "int8" and chat.options is plan.options
    assert chat.session.messages[-1].settings["step"] == chat.step_name() == plan.step


def test_the_plan_names_the_kernels_only_where_they_load():
    plan = decide(make_chat_model(), "int8", "cpu", EngineOptions(native=False))
    if native.load() is None:
        assert plan.kernel_path is None and plan.step.startswith("torch-int8")
    else:
        assert plan.kernel_path == native.kernel_path() and plan.step_version == native.step_version()
        assert not plan.native and plan.step.startswith("torch-int8")      # the options keep the step off them
    fp32 = decide(make_chat_model(), "none", "cpu")
    assert fp32.step is None and fp32.kernel_path is None and fp32.prefill_gemm is None


@pytest.mark.parametrize("native_on, prefill, want", [
    (True, "native-gemm", "native-int8-v6@avx2"),
    (True, "bf16-gemm", "native-int8-v6+bf16-prefill@avx2"),
    (True, "fp32-gemm", "native-int8-v6+fp32-prefill@avx2"),
    (False, "native-gemm", "torch-int8+native-prefill-v6@avx2"),
    (False, "bf16-gemm", "torch-int8+bf16-prefill"),
    (False, "fp32-gemm", "torch-int8"),
])
def test_step_names_are_the_ones_sessions_record(native_on, prefill, want):
    assert step_name(native_on, prefill, 6, "avx2") == want


def test_a_plan_off_the_cpu_has_no_int8_step():
    assert ExecutionPlan(quant="int8", device="cuda").step is None
    assert ExecutionPlan(quant="int8", device="cpu", kernel_path="avx2", step_version=6).native
