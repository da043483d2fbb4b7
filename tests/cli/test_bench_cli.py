import json

from typer.testing import CliRunner

from tinychat.cli import app

KEYS = {"prefill_tok_s", "ttft_ms", "decode_tok_s", "kv_bytes_per_token", "peak_rss_mb", "quant", "device",
        "linear_params"}


def test_bench_json_has_the_documented_keys():
    r = CliRunner().invoke(app, ["bench", "--config", "tiny", "--json", "--repeats", "1", "--gen-len", "4",
                                 "--prompt-len", "8"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert KEYS <= set(res)
    assert res["quant"] == "none" and res["device"] == "cpu" and res["decode_tok_s"] > 0
    assert res["kv_bytes_per_token"] < res["gqa_kv_bytes_per_token"]


def test_bench_rejects_bad_quant():
    r = CliRunner().invoke(app, ["bench", "--config", "tiny", "--quant", "int3"])
    assert r.exit_code != 0


def test_bench_offers_only_its_own_options_and_refuses_a_chat_flag():
    r = CliRunner().invoke(app, ["bench", "--help"])
    assert r.exit_code == 0 and "--prompt-len" in r.output and "One-shot" not in r.output
    r = CliRunner().invoke(app, ["bench", "--config", "tiny", "-p", "hello"])
    assert r.exit_code == 2


def test_the_bench_table_counts_in_words():
    r = CliRunner().invoke(app, ["bench", "--config", "tiny", "--repeats", "1", "--gen-len", "1", "--prompt-len", "1"])
    assert r.exit_code == 0, r.output
    assert "1 repeat" in r.output and "1 repeats" not in r.output and "1 tokens" not in r.output
    assert "prefill (1 token)" in r.output and "decode (batch 1, 1 token)" in r.output


def test_bench_runs_int4_on_the_native_step_where_the_kernels_build():
    from tinychat.engine import native
    r = CliRunner().invoke(app, ["bench", "--config", "tiny", "--quant", "int4", "--json", "--repeats", "1",
                                 "--gen-len", "4", "--prompt-len", "8", "--threads", "1"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["quant"] == "int4" and res["decode_tok_s"] > 0
    if native.load() is not None:
        assert res["int8_kernels"] == native.kernel_path() and res["int8_prefill"] == "native-gemm"


def test_bench_says_how_much_of_the_weights_it_ran_from_huge_pages(monkeypatch):
    from tinychat.engine import weight_arena
    monkeypatch.setattr(weight_arena, "available", lambda: True)
    args = ["bench", "--config", "demo", "--quant", "int8", "--repeats", "1", "--gen-len", "2", "--prompt-len", "4",
            "--threads", "1"]
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    on = json.loads(r.stdout)["huge_pages_mb"]
    assert on >= 15                                    # the demo size's int8 Linears (~22 MB)
    monkeypatch.setenv("TINYCHAT_HUGE_PAGES", "0")
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["huge_pages_mb"] == 0
    monkeypatch.delenv("TINYCHAT_HUGE_PAGES")
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0 and "weights on huge pages" in r.output and f"{on:,} MB" in r.output
