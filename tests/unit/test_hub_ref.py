"""`tinychat pull`'s argument and GGUF choice (tinychat/hub/ref.py): REPO[:QUANT][@REVISION], quant types read from
file names as llama.cpp's -hf matches them, Q8_0 by default else the closest in bits, and what cannot be a repo."""
import pytest

from tinychat.hub import PullError
from tinychat.hub.ref import RepoRef, gguf_choices, human_bytes, is_repo_id, parse_ref, pick_quant, quant_of


def test_a_ref_splits_into_repo_quant_and_revision():
    assert parse_ref("bartowski/SmolLM2-360M-Instruct-GGUF:Q4_K_M@main") == \
        RepoRef("bartowski/SmolLM2-360M-Instruct-GGUF", "Q4_K_M", "main")
    assert parse_ref("HuggingFaceTB/SmolLM2-135M-Instruct") == RepoRef("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert parse_ref("hf.co/org/model.v1@" + "a" * 40) == RepoRef("org/model.v1", None, "a" * 40)
    assert parse_ref("https://huggingface.co/org/m:q8_0") == RepoRef("org/m", "q8_0")
    assert str(parse_ref("org/m:Q8_0@v2")) == "org/m:Q8_0@v2"
    assert parse_ref("org/m@refs/pr/1").revision == "refs/pr/1"


@pytest.mark.parametrize("text", ["org/m@../../etc", "org/m@/abs", "org/m@a b", "org/m@x/../y", "org/m@main/"])
def test_a_revision_cannot_climb_out_of_the_cache(text):
    with pytest.raises(PullError, match="bad revision"):
        parse_ref(text)


@pytest.mark.parametrize("text", ["gpt2", "a/b/c", "org/", "/m", "org/m:", "org/m@", "org--x/m", "org/m..x",
                                  "~/models/x.gguf", "./org/m", "", "org/m:Q4 K"])
def test_what_is_not_a_repo_id_is_refused_in_one_line(text):
    assert not is_repo_id(text)
    with pytest.raises(PullError) as e:
        parse_ref(text)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("path,quant", [
    ("SmolLM2-135M-Instruct-Q8_0.gguf", "Q8_0"), ("smollm2-360m-instruct-q4_k_m.gguf", "Q4_K_M"),
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"), ("Llama-3.2-1B-Instruct-IQ4_XS.gguf", "IQ4_XS"),
    ("qwen2.5-0.5b-instruct-fp16.gguf", "F16"), ("UD-Q4_K_XL/model-00001-of-00002.gguf", "Q4_K_XL"),
    ("model-BF16.gguf", "BF16"), ("model.gguf", None), ("Qwen3-0.6B-Q8_0-00001-of-00003.gguf", "Q8_0")])
def test_the_quant_type_is_read_from_the_file_name(path, quant):
    assert quant_of(path) == quant


def test_q8_0_is_the_default_and_else_the_closest_in_bits():
    sizes = {"m-Q4_K_M.gguf": 100, "m-Q8_0.gguf": 150, "m-F16.gguf": 270, "mmproj-m-f16.gguf": 5, "README.md": 1}
    choices = gguf_choices(sizes)
    assert [c.quant for c in choices] == ["F16", "Q8_0", "Q4_K_M"]             # the projector is not a model
    assert pick_quant(choices, None, "o/m").quant == "Q8_0"
    del sizes["m-Q8_0.gguf"]
    assert pick_quant(gguf_choices(sizes), None, "o/m").quant == "Q4_K_M"      # 4.89 bits is nearer 8.5 than 16
    assert pick_quant(gguf_choices({"a-Q6_K.gguf": 1, "a-Q5_K_M.gguf": 1, "a-F16.gguf": 1}), None, "o/a").quant == "Q6_K"
    assert pick_quant(gguf_choices({"weird.gguf": 7}), None, "o/w").files == ["weird.gguf"]


def test_a_quant_is_matched_case_insensitively_and_a_missing_one_lists_the_others():
    choices = gguf_choices({"m-Q4_K_M.gguf": 2 << 20, "m-Q8_0.gguf": 3 << 20})
    assert pick_quant(choices, "q4_k_m", "o/m").files == ["m-Q4_K_M.gguf"]
    assert pick_quant(choices, "m-Q8_0.gguf", "o/m").quant == "Q8_0"
    with pytest.raises(PullError, match=r"^o/m has no Q2_K GGUF \(it has: Q8_0 3\.0 MiB, Q4_K_M 2\.0 MiB\)$"):
        pick_quant(choices, "Q2_K", "o/m")
    with pytest.raises(PullError, match="no GGUF files"):
        pick_quant([], None, "o/m")


def test_a_split_gguf_is_one_choice_of_its_parts_unless_a_whole_file_exists():
    split = gguf_choices({"Q8_0/m-00001-of-00002.gguf": 5, "Q8_0/m-00002-of-00002.gguf": 6})
    assert len(split) == 1 and split[0].split and split[0].size == 11
    whole = gguf_choices({"m-Q8_0-00001-of-00002.gguf": 5, "m-Q8_0-00002-of-00002.gguf": 6, "m-Q8_0.gguf": 11})
    assert whole[0].files == ["m-Q8_0.gguf"] and not whole[0].split


def test_sizes_read_in_binary_units():
    assert [human_bytes(n) for n in (512, 1536, 150 << 20, 3 << 30, 2 ** 55)] == \
        ["512 B", "1.5 KiB", "150 MiB", "3.0 GiB", "32.0 PiB"]
