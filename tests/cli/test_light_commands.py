"""Commands that only read files answer without torch: `tinychat --help`, `sessions` and `models` never import it
(torch's import alone is 1-2 s), nor Textual, nor the tokenizer or safetensors."""
import json
import os
import subprocess
import sys

import pytest

HEAVY = ("torch", "textual", "tokenizers", "safetensors")

PROBE = """
import json, sys
sys.argv = ["tinychat", *json.loads(sys.argv[1])]
from tinychat import cli
try:
    cli.main()
except SystemExit as e:
    rc = e.code
sys.__stderr__.write("\\nPROBE " + json.dumps({"rc": rc, "loaded": [m for m in %r if m in sys.modules]}) + "\\n")
""" % (HEAVY,)


def _probe(args: list[str]) -> dict:
    p = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    line = [x for x in p.stderr.splitlines() if x.startswith("PROBE ")]
    assert line, p.stdout + p.stderr
    return json.loads(line[-1][len("PROBE "):])


@pytest.mark.parametrize("args", [["--help"], ["sessions"], ["sessions", "list", "--json"], ["sessions", "--help"],
                                  ["models"], ["models", "--json"], ["serve", "--help"], ["import", "--help"]])
def test_listing_and_help_commands_do_not_import_torch(args):
    r = _probe(args)
    assert r["rc"] in (0, None) and r["loaded"] == [], r


def test_the_probe_sees_torch_where_a_command_needs_it():
    """The probe can fail: `info` loads a model, and with it torch."""
    r = _probe(["info", "--config", "tiny", "--json"])
    assert r["rc"] in (0, None) and "torch" in r["loaded"], r
