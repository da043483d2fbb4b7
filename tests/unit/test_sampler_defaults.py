"""Per-model sampler defaults (tinychat/sampler_defaults.py): where an import finds them, the sampler.json that holds
them, and the layers a chat's settings come from -- tinychat's < the model's < the session's < flags and /set -- with
each value's source, as `info`, F2 and `/set` show it. Sessions record the resolved values, so replay is unchanged."""
import json

import pytest
from typer.testing import CliRunner

from support import make_chat_model, tokenizer
from tinychat import sampler_defaults as SD
from tinychat.cli import app
from tinychat.loading import LoadError, load_runtime, open_chat
from tinychat.settings import ChatSettings

SMOL = {"settings": {"temperature": 0.2, "top_p": 0.9, "penalty": 1.0},
        "from": {"temperature": "SmolLM2's model card (tinychat's table)", "top_p": "SmolLM2's model card (tinychat's table)",
                 "penalty": SD.IMPORTED_SOURCE}, "unused": {"top_k": 50}}


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "m"
    make_chat_model().save_pretrained(d)
    tokenizer().save(d / "tokenizer.json")
    (d / SD.SAMPLER_FILE).write_text(json.dumps(SMOL))
    return d


def test_layers_resolve_flags_over_session_over_model_over_tinychat():
    model = SD.ModelDefaults({"temperature": 0.2, "top_p": 0.7, "penalty": 1.0},
                             {"temperature": "card", "top_p": "card", "penalty": "base"})
    st, src = SD.resolve(model, {"top_p": 0.5, "penalty": 1.1}, {"penalty": 1.3})
    assert (st.temperature, st.top_p, st.penalty, st.max_new) == (0.2, 0.5, 1.3, ChatSettings().max_new)
    assert src == {**{k: SD.TINYCHAT for k in src}, "temperature": "card", "top_p": "the session", "penalty": "flag"}
    assert SD.resolve(SD.ModelDefaults())[0] == ChatSettings()                 # no model defaults: tinychat's


def test_an_import_finds_the_checkpoints_values_then_the_family_table_then_the_base():
    qwen_like = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
    d = SD.derive(*SD.from_generation_config(qwen_like)[:2], ["Qwen2.5-0.5B-Instruct"],
                  SD.from_generation_config(qwen_like)[2])
    assert d.values == {"temperature": 0.7, "top_p": 0.8, "penalty": 1.05, "ban": False, "no_parrot": False,
                        "max_new": 1024}
    assert d.sources["penalty"] == "generation_config.json's repetition_penalty" and d.unused == {"top_k": 20}
    smol = SD.derive({}, {}, ["smollm2-360m-instruct-q8_0.gguf"])          # the checkpoint says nothing
    assert (smol.values["temperature"], smol.values["top_p"], smol.values["penalty"]) == (0.2, 0.9, 1.0)
    assert smol.sources["temperature"] == "SmolLM2's model card (tinychat's table)"
    own = SD.derive({"temperature": 0.5}, {"temperature": "the GGUF's general.sampling.temp"}, ["SmolLM2"])
    assert own.values["temperature"] == 0.5 and own.values["top_p"] == 0.9     # the checkpoint's own value wins
    assert SD.derive({}, {}, ["TinyLlama-1.1B-Chat"]).values == SD.IMPORTED
    assert SD.derive({}, {}, ["x"], context=512).values["max_new"] == 128      # a reply leaves room for the prompt
    assert SD.derive({"max_new": 600}, {"max_new": "x"}, ["x"], context=512).values["max_new"] == 600


def test_gguf_sampling_keys_map_onto_tinychats_settings():
    import struct
    temp32 = struct.unpack("<f", struct.pack("<f", 0.3))[0]                   # as a GGUF float32 reads
    values, sources, unused = SD.from_gguf_fields({"general.sampling.temp": temp32, "general.sampling.top_p": 0.95,
                                                   "general.sampling.penalty_repeat": 1.1,
                                                   "general.sampling.penalty_last_n": 128,
                                                   "general.sampling.top_k": 40, "general.sampling.min_p": 0.05,
                                                   "general.sampling.sequence": "kpt", "general.name": "x"})
    assert values == {"temperature": 0.3, "top_p": 0.95, "penalty": 1.1, "penalty_window": 128}
    assert sources["penalty_window"] == "the GGUF's general.sampling.penalty_last_n"
    assert unused == {"top_k": 40, "min_p": 0.05}
    assert SD.from_generation_config({"temperature": 1e-6, "top_p": 0.0, "repetition_penalty": True})[0] == \
        {"temperature": 1e-6, "top_p": 0.01}                                  # clamped into range; a bool is no number


def test_sampler_json_is_read_checked_and_refused_in_one_line(model_dir, tmp_path):
    d = SD.read(model_dir)
    assert d.values == SMOL["settings"] and d.sources["penalty"] == SD.IMPORTED_SOURCE and d.unused == {"top_k": 50}
    f = model_dir / SD.SAMPLER_FILE
    for bad, says in (("{not json", "unreadable"), ('{"settings": {"temperature": 9}}', "temperature must be between"),
                      ('{"settings": {"tempo": 1}}', "unknown setting 'tempo'"),
                      ('{"settings": {"ban": "yes"}}', "ban = 'yes' is not a bool"), ("[1]", "not a JSON object")):
        f.write_text(bad)
        with pytest.raises(SD.SamplerFileError) as e:
            SD.read(model_dir)
        assert str(e.value).startswith(str(f)) and says in str(e.value) and "\n" not in str(e.value)
        with pytest.raises(LoadError):
            load_runtime(model_dir)
    assert SD.read(tmp_path / "nothing-here") == SD.ModelDefaults()            # a TinyAgentLM folder: none


def test_a_model_imported_before_sampler_json_gets_what_an_import_writes_today(tmp_path):
    d = tmp_path / "smollm2"
    d.mkdir()
    (d / "import.json").write_text(json.dumps({"source": "/x/SmolLM2-135M-Instruct.Q4_1.gguf"}))
    assert SD.read(d).values == {"temperature": 0.2, "top_p": 0.9, **SD.IMPORTED}


def test_a_new_chat_starts_at_the_models_defaults_and_flags_and_set_win(model_dir):
    rt = load_runtime(model_dir)
    chat = open_chat(rt, "none", "cpu", None, {"top_p": 0.5})
    st = chat.settings
    assert (st.temperature, st.top_p, st.penalty, st.ban) == (0.2, 0.5, 1.0, ChatSettings().ban)
    assert chat.sources["temperature"] == "SmolLM2's model card (tinychat's table)"
    assert chat.sources["top_p"] == "flag" and chat.sources["ban"] == SD.TINYCHAT
    chat.set("temperature", "0.6")
    assert chat.settings.temperature == 0.6 and chat.sources["temperature"] == "/set"
    exact = open_chat(rt, "none", "cpu", ChatSettings(temperature=0.9), {})   # a caller's exact settings
    assert exact.settings.temperature == 0.9 and exact.settings.penalty == ChatSettings().penalty


def test_a_session_keeps_its_recorded_settings_and_replays_exactly(model_dir):
    from tinychat.sessions import session as S
    from tinychat.chat.replay import replay_tree
    from tinychat.loading import open_replay_chat
    rt = load_runtime(model_dir)
    chat = open_chat(rt, "none", "cpu", None, {"max_new": 6, "seed": 4})
    chat.send("hello there")
    assert chat.session.messages[-1].settings["temperature"] == 0.2           # the resolved value, recorded
    sid = chat.session.id
    chat.close()
    (model_dir / SD.SAMPLER_FILE).write_text(json.dumps({"settings": {"temperature": 1.5, "top_p": 0.3}}))
    rt = load_runtime(model_dir)
    again = open_chat(rt, "none", "cpu", None, {}, sid)
    assert (again.settings.temperature, again.settings.top_p) == (0.2, 0.9)    # the session's, not the new defaults
    assert again.sources["temperature"] == "the session"
    again.close()
    sess = S.load(sid)
    results = replay_tree(open_replay_chat(rt, sess, "cpu"), sess)
    assert all(b.report.ok for b in results)


def test_plain_set_lists_each_value_with_where_it_came_from(model_dir):
    r = CliRunner().invoke(app, ["--model", str(model_dir), "--plain", "--penalty", "1.4"], input="/set\n")
    assert r.exit_code == 0, r.output
    lines = {ln.split()[0]: ln for ln in r.stderr.splitlines() if ln.startswith("  ")}
    assert lines["temperature"].split()[1:] == ["0.2", "SmolLM2's", "model", "card", "(tinychat's", "table)"]
    assert lines["penalty"].split()[1:] == ["1.4", "flag"]
    assert lines["ban-reply"].split()[1:] == ["True", "tinychat's", "default"]


def test_info_shows_the_sampler_defaults_and_their_sources(model_dir):
    r = CliRunner().invoke(app, ["info", "--model", str(model_dir), "--json"])
    assert r.exit_code == 0, r.output
    facts = json.loads(r.stdout)
    assert facts["sampler"]["temperature"] == {"value": 0.2, "from": "SmolLM2's model card (tinychat's table)"}
    assert facts["sampler"]["ban_reply"] == {"value": True, "from": SD.TINYCHAT}
    assert facts["sampler_unused"] == {"top_k": 50}
    shipped = json.loads(CliRunner().invoke(app, ["info", "--json"]).stdout)["sampler"]
    assert {k: v["value"] for k, v in shipped.items()} == SD.resolve(SD.ModelDefaults())[0].sampler()
    assert {v["from"] for v in shipped.values()} == {SD.TINYCHAT}             # the shipped model keeps tinychat's
