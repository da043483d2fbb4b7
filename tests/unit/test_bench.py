"""tinychat.bench: the shape and sanity of run_bench()'s result on the tiny config (no timing assertions beyond
positivity and internal consistency: speeds are never asserted in unit tests)."""
import json

import pytest
import torch

from tinychat.bench import render_table, run_bench

KEYS = {"prefill_tok_s", "ttft_ms", "decode_tok_s", "kv_bytes_per_token", "gqa_kv_bytes_per_token", "peak_rss_mb",
        "quant", "device", "linear_params", "mode", "prompt_len", "gen_len", "repeats"}


@pytest.fixture(scope="module")
def results():
    calls = []
    r = run_bench(config="tiny", quant="int8", prompt_len=24, gen_len=8, repeats=2,
                  progress=lambda done, total, what: calls.append((done, total, what)))
    return r, calls


def test_json_shape_and_types(results):
    r, _ = results
    assert KEYS <= set(r)
    json.loads(json.dumps(r))                       # one plain JSON object
    assert r["device"] == "cpu" and r["prompt_len"] == 24 and r["gen_len"] == 8 and r["repeats"] == 2
    for k in ("prefill_tok_s", "ttft_ms", "decode_tok_s", "peak_rss_mb"):
        assert isinstance(r[k], float) and r[k] > 0, k
    assert isinstance(r["linear_params"], int) and isinstance(r["kv_bytes_per_token"], int)


def test_values_are_consistent(results):
    r, _ = results
    from tinychat.engine import int8_kernel_ok
    from tinychat.model import config_for
    c = config_for("tiny")
    assert r["quant"] == ("int8" if int8_kernel_ok() else "bf16")
    assert r["mode"] == f"fast-{r['quant']}"
    # the Linear weights of the model, counted before quantization (embeddings / Engram tables excluded)
    assert r["linear_params"] == 196608
    assert r["kv_bytes_per_token"] == c.kv_bytes_per_token(4)          # fp32 cache on the CPU
    assert r["gqa_kv_bytes_per_token"] == c.gqa_kv_bytes_per_token(4) == 2 * r["kv_bytes_per_token"]
    # TTFT = the prefill plus one draw: never shorter than the prefill itself (medians of per-repeat pairs)
    assert r["ttft_ms"] >= 1e3 * r["prompt_len"] / max(r["prefill_tok_s_all"]) * 0.999
    assert len(r["prefill_tok_s_all"]) == len(r["decode_tok_s_all"]) == 2
    assert min(r["decode_tok_s_all"]) <= r["decode_tok_s"] <= max(r["decode_tok_s_all"])
    assert abs(r["decode_ms_per_token"] * r["decode_tok_s"] - 1e3) < 1e-6


def test_progress_reaches_total(results):
    _, calls = results
    assert calls and calls[-1][0] == calls[-1][1]
    assert [c[0] for c in calls] == list(range(1, len(calls) + 1))


def test_render_table(results):
    from rich.console import Console
    console = Console(width=120, record=True)
    console.print(render_table(results[0]))
    text = console.export_text()
    assert "decode" in text and "tok/s" in text and "time to first token" in text


def test_fp32_mode_and_bad_arguments():
    r = run_bench(config="tiny", quant="none", prompt_len=8, gen_len=4, repeats=1, warmup=0)
    assert r["quant"] == "none" and r["mode"] == "eager" and r["decode_tok_s"] > 0
    with pytest.raises(ValueError, match="quant"):
        run_bench(config="tiny", quant="int3")
    with pytest.raises(ValueError, match="positive"):
        run_bench(config="tiny", gen_len=0)
    with pytest.raises(ValueError, match="max_seq_len"):
        run_bench(config="tiny", prompt_len=500, gen_len=100)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            run_bench(config="tiny", device="cuda")


def test_extra_prefill_lengths():
    r = run_bench(config="tiny", quant="bf16", prompt_len=8, gen_len=4, repeats=1, warmup=0, prefill_lens=(16, 40))
    assert set(r["prefill_by_len"]) == {"16", "40"} and all(v > 0 for v in r["prefill_by_len"].values())
    json.loads(json.dumps(r))


def test_threads_auto_unless_pinned():
    """The int8 native step's thread count is tuned (reported as threads_used) unless --threads pins it; a pinned
    run leaves the tuner on for later runs."""
    from tinychat.engine import native
    if native.load() is None:
        pytest.skip(f"no native kernels here: {native.why_not}")
    was = torch.get_num_threads()
    try:
        r = run_bench(config="tiny", quant="int8", prompt_len=8, gen_len=4, repeats=1, threads=1)
        assert (r["threads"], r["threads_auto"], r["threads_used"]) == (1, False, 1)
        assert r["int8_kernels"] == native.kernel_path() != "pytorch"     # which native path ran
        assert r["int8_prefill"] == "native-gemm"                        # 8 prompt rows: the native int8 GEMM
        torch.set_num_threads(2)
        r = run_bench(config="tiny", quant="int8", prompt_len=8, gen_len=4, repeats=1)
        assert r["threads"] == 2 and r["threads_auto"] and r["threads_used"] in (1, 2)
    finally:
        torch.set_num_threads(was)
