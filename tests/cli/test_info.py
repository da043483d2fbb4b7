import json
import subprocess
import sys

from typer.testing import CliRunner

from tinychat.cli import app


def test_info_reports_kv_bytes_next_to_standard_gqa():
    r = CliRunner().invoke(app, ["info", "--config", "tiny", "--json"])
    assert r.exit_code == 0, r.output
    facts = json.loads(r.output)
    assert facts["kv_bytes_per_token"] * 2 == facts["gqa_kv_bytes_per_token"]      # tiny: kv_group 2
    assert facts["params"] > facts["linear_params"] > 0 and facts["family"] == "TinyAgentLM"
    from tinychat.engine import native
    assert facts["int8_kernels"].split()[0] == native.kernel_path()   # e.g. avx512-vnni; pytorch (why) when off
    if native.load() is not None:                  # the name an int8 turn records, as replay compares it
        assert facts["int8_step"] == f"native-int8-v{native.step_version()}@{native.kernel_path()}"
        from support import make_chat
        chat = make_chat(quant="int8", autosave=False)
        assert chat.step_name().split("+")[0].split("@")[0] == facts["int8_step"].split("@")[0]
    else:
        assert facts["int8_step"] == "torch-int8"
    from tinychat.engine.quant import cpu_has_amx, cpu_has_bf16_dot
    if native.gemm_lib() is not None:           # long int8 prefills: the native GEMM, bf16 GEMMs on AMX machines
        assert facts["int8_prefill"] == ("bf16 GEMMs" if cpu_has_amx() else "native int8 GEMM")
        assert facts["int4_prefill"] == ("bf16 GEMMs" if cpu_has_amx() else "native int4 GEMM")   # the same rule
    else:
        assert facts["int8_prefill"] == ("bf16 GEMMs" if cpu_has_bf16_dot() else "fp32 GEMMs")


def test_info_says_bf16_prefill_when_asked_and_fp32_without_kernels_or_bf16(monkeypatch):
    monkeypatch.setenv("TINYCHAT_PREFILL_BF16", "1")
    facts = json.loads(CliRunner().invoke(app, ["info", "--config", "tiny", "--json"]).output)
    assert facts["int8_prefill"] == "bf16 GEMMs"
    from tinychat.engine import native
    assert facts["int4_prefill"] == ("bf16 GEMMs" if native.load() is not None else "fp32 GEMMs")
    monkeypatch.setenv("TINYCHAT_PREFILL_BF16", "0")
    monkeypatch.setenv("TINYCHAT_NATIVE", "0")
    facts = json.loads(CliRunner().invoke(app, ["info", "--config", "tiny", "--json"]).output)
    assert facts["int8_prefill"] == "fp32 GEMMs" and facts["int4_prefill"] == "fp32 GEMMs"


def test_info_bad_config_is_one_line_exit_2():
    p = subprocess.run([sys.executable, "-m", "tinychat", "info", "--config", "huge"], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "--config must be one of" in p.stderr
    assert "Traceback" not in p.stderr


def test_info_missing_model_folder_is_one_line_exit_2(tmp_path):
    p = subprocess.run([sys.executable, "-m", "tinychat", "info", "--model", str(tmp_path / "x")],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "no such model folder" in p.stderr and "Traceback" not in p.stderr


def test_help_does_not_import_torch():
    code = "import sys; sys.argv=['tinychat','--help']\nfrom tinychat import cli\ntry: cli.main()\nexcept SystemExit: pass\n" \
           "print('torch' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.stdout.strip().endswith("False"), p.stdout + p.stderr


def test_app_window_opens_before_torch_is_imported():
    """The interactive path hands over to the app without importing torch: the model (and torch) load on the app's
    worker behind the window, and --device auto is resolved there."""
    code = """
import sys
class Tty:
    def __init__(self, f): self.f = f
    def isatty(self): return True
    def __getattr__(self, k): return getattr(self.f, k)
sys.stdin, sys.stdout = Tty(sys.stdin), Tty(sys.stdout)
sys.argv = ['tinychat', '--temperature', '0.5']
import tinychat.tui.app as A
seen = {}
def fake_run_app(**kw):
    seen.update(torch='torch' in sys.modules, device=kw['device'], temperature=kw['overrides']['temperature'])
    return 0
A.run_app = fake_run_app
from tinychat import cli
try:
    cli.main()
except SystemExit as e:
    seen['rc'] = e.code
sys.stdout.f.write(repr(seen))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.stdout.strip() == "{'torch': False, 'device': 'auto', 'temperature': 0.5, 'rc': 0}", p.stdout + p.stderr


def test_info_takes_the_model_as_an_argument_as_well_as_by_model(tmp_path):
    from support import make_model
    folder = tmp_path / "m"
    make_model().save_pretrained(folder)
    by_arg = CliRunner().invoke(app, ["info", str(folder), "--json"])
    by_opt = CliRunner().invoke(app, ["info", "--model", str(folder), "--json"])
    assert by_arg.exit_code == by_opt.exit_code == 0, by_arg.output
    assert json.loads(by_arg.output) == json.loads(by_opt.output)
    assert json.loads(by_arg.output)["model"] != json.loads(CliRunner().invoke(app, ["info", "--json"]).output)["model"]
    both = CliRunner().invoke(app, ["info", str(folder), "--model", str(tmp_path)])
    assert both.exit_code == 2 and "give the model once" in both.output
