"""`tinychat pull` end to end: a fresh process, the real huggingface_hub client, a fake Hub on 127.0.0.1 serving the
tiny model's repos (tests/fake_hub.py). What lands in the standard HF cache, what is imported, what is never fetched,
and every refusal as one line."""
import json
import shutil
import signal
import time

from tinychat import paths
from tinychat.hub.ref import human_bytes
from tinychat.importer.store import list_models


def _model(name):
    d = paths.models_dir() / name
    return d, json.loads((d / "import.json").read_text()), json.loads((d / "sampler.json").read_text())


def _blobs(hf_cache, repo):
    return sorted((hf_cache / ("models--" + repo.replace("/", "--")) / "blobs").iterdir())


def test_a_safetensors_repo_pulls_only_what_the_importer_needs(tinychat, hub, hf_cache):
    r = tinychat("pull", "org/tiny")
    assert r.returncode == 0, r.stderr
    commit = hub.repos["org/tiny"].commit
    assert "pulled org/tiny as tiny" in r.stdout and "chat with: tinychat --model tiny" in r.stdout
    assert f"org/tiny at {commit[:12]}: 5 files" in r.stderr       # the size, before the download
    got = {x.path.rsplit("/", 1)[-1] for x in hub.requests("GET", "/resolve/")}
    assert got == {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
                   "model.safetensors"}                             # not README.md, onnx/, pytorch_model.bin
    snap = hf_cache / "models--org--tiny" / "snapshots" / commit
    assert (snap / "model.safetensors").is_symlink() and (hf_cache / "models--org--tiny" / "refs" / "main").read_text() == commit
    d, meta, sampler = _model("tiny")
    assert meta["hub"] == {"repo": "org/tiny", "revision": "main", "commit": commit, "quant": None,
                           "files": ["config.json", "tokenizer_config.json", "generation_config.json",
                                     "tokenizer.json", "model.safetensors"]}
    assert meta["source"] == f"org/tiny@{commit[:12]} (Hugging Face)"
    # the checkpoint's generation_config.json, then tinychat's base for imported models (max-new: a quarter of the
    # tiny model's 256 positions)
    assert sampler["settings"] == {"temperature": 0.6, "top_p": 0.8, "penalty": 1.0, "ban": False, "no_parrot": False,
                                   "max_new": 64}
    assert sampler["from"]["temperature"] == "generation_config.json's temperature" and sampler["unused"] == {"top_k": 20}
    assert [m["name"] for m in list_models()] == ["tiny"]
    # a second pull is a no-op: one model-info call, no file
    n = len(hub.log)
    r = tinychat("pull", "org/tiny")
    assert r.returncode == 0 and "tiny is up to date" in r.stdout
    assert [x.path for x in hub.log[n:]] == ["/api/models/org/tiny"]
    # the name is taken by a model from another repo
    r = tinychat("pull", "org/tiny-sharded", "--name", "tiny")
    assert r.returncode == 2 and "a model named 'tiny' exists already (from org/tiny)" in r.stderr
    assert "pick another --name or add --force" in r.stderr


def test_a_gguf_repo_pulls_q8_0_by_default_and_a_quant_by_name(tinychat, hub, hf_cache):
    # the connection drops mid-file (the second GET: the first read the header) and the hub retries in the same
    # pull (by Range from its last whole 10 MiB chunk: for this small file, from the start)
    size = len(hub.repos["org/tiny-GGUF"].files["tiny-Q8_0.gguf"])
    hub.drop_once("org/tiny-GGUF", "tiny-Q8_0.gguf", 20_000, skip=1)
    r = tinychat("pull", "org/tiny-GGUF")
    assert r.returncode == 0, r.stderr
    assert "pulled org/tiny-GGUF as tiny-Q8_0" in r.stdout
    assert [x.sent for x in hub.requests("GET", "tiny-Q8_0.gguf")][1:] == [20_000, size]
    assert not hub.requests(None, "mmproj") and not hub.requests(None, "Q4_K_M")
    d, meta, sampler = _model("tiny-Q8_0")
    assert meta["hub"]["quant"] == "Q8_0" and meta["hub"]["files"] == ["tiny-Q8_0.gguf"]
    # its Q8_0 weights stored int8 (--quant auto), said so
    assert meta["quant"] == "int8" and "weights: int8, packed (the GGUF's weights are Q8_0;" in r.stdout
    # the GGUF's general.sampling.* keys
    assert sampler["settings"]["temperature"] == 0.3 and sampler["from"]["top_p"] == "the GGUF's general.sampling.top_p"
    assert sampler["unused"] == {"top_k": 40}


def test_pull_quant_stores_packed_weights_and_a_pull_in_another_mode_imports_again(tinychat, hub):
    r = tinychat("pull", "org/tiny", "--quant", "int4")
    assert r.returncode == 0, r.stderr
    assert [(m["name"], m["quant"]) for m in list_models()] == [("tiny", "int4")] and _model("tiny")[1]["quant"] == "int4"
    r = tinychat("pull", "org/tiny", "--quant", "int4")
    assert r.returncode == 0 and "tiny is up to date" in r.stdout
    r = tinychat("pull", "org/tiny")                    # auto (the default) takes what is there at this commit
    assert r.returncode == 0 and "tiny is up to date" in r.stdout
    r = tinychat("pull", "org/tiny", "--quant", "none")  # full precision now: the same commit, imported again
    assert r.returncode == 0 and "pulled org/tiny as tiny" in r.stdout, r.stderr
    assert "weights: full precision, float32\n" in r.stdout
    assert [(m["name"], m["quant"]) for m in list_models()] == [("tiny", None)]


def test_list_shows_the_quants_with_sizes_and_a_missing_quant_lists_them(tinychat, hub):
    r = tinychat("pull", "org/tiny-GGUF", "--list")
    assert r.returncode == 0, r.stderr
    rows = r.stdout.splitlines()[1:]
    assert [row.split()[0] for row in rows] == ["Q8_0", "Q4_K_M"] and rows[0].endswith("(default)")
    assert "KiB" in rows[0] and not hub.requests(None, "/resolve/")
    r = tinychat("pull", "org/tiny-GGUF:Q5_K_M")
    assert r.returncode == 2
    sizes = [human_bytes(len(hub.repos["org/tiny-GGUF"].files[f])) for f in ("tiny-Q8_0.gguf", "tiny-Q4_K_M.gguf")]
    assert r.stderr.strip() == (f"tinychat: error: org/tiny-GGUF has no Q5_K_M GGUF (it has: Q8_0 {sizes[0]}, "
                                f"Q4_K_M {sizes[1]})")


def _wait_for_part(blobs, etag, at_least, proc, timeout=120):
    """The size of the part file of blob etag a running pull has on disk once it holds at_least bytes
    (huggingface_hub writes in 10 MiB chunks)."""
    deadline = time.time() + timeout

    def sizes():
        return [f.stat().st_size for f in (blobs.glob(f"{etag}*.incomplete") if blobs.is_dir() else ())]
    while time.time() < deadline and proc.poll() is None:
        if max(sizes(), default=0) >= at_least:
            time.sleep(0.2)             # no more bytes come: the server holds the rest back
            return max(sizes())
        time.sleep(0.1)
    raise AssertionError(f"no part file of {at_least} bytes appeared (pull exit {proc.poll()})")


CHUNK = 10 << 20


def test_a_pull_interrupted_mid_file_leaves_no_model_and_the_next_one_resumes_it(popen, tinychat, hub, hf_cache):
    repo, shard = "org/big-sharded", "model-00002-of-00002.safetensors"
    size = len(hub.repos[repo].files[shard])
    assert size > CHUNK + 1000
    release = hub.stall(repo, shard, CHUNK + 1000)
    p = popen("pull", repo)
    blobs = hf_cache / "models--org--big-sharded" / "blobs"
    have = _wait_for_part(blobs, hub.repos[repo].etag(shard), CHUNK, p)
    p.send_signal(signal.SIGINT)                # Ctrl+C mid-file
    out, err = p.communicate(timeout=60)
    release.set()
    assert p.returncode == 130, err
    assert "interrupted at" in err and f"tinychat pull {repo}` resumes" in err
    assert list_models() == [] and not (paths.models_dir() / "big-sharded").exists()
    first = len(hub.log)
    r = tinychat("pull", repo)
    assert r.returncode == 0, r.stderr
    assert "of it cached" in r.stderr
    fetched = [x for x in hub.log[first:] if x.method == "GET" and "/resolve/" in x.path]
    assert [x.path.rsplit("/", 1)[-1] for x in fetched] == [shard]           # the first shard stays cached
    assert fetched[0].range == f"bytes={have}-" and fetched[0].status == 206 and fetched[0].sent == size - have
    assert not any(f.name.endswith(".incomplete") for f in blobs.iterdir())
    assert [m["name"] for m in list_models()] == ["big-sharded"]


def test_a_killed_pull_of_one_gguf_resumes_that_file(popen, tinychat, hub, hf_cache):
    repo, f = "org/big-GGUF", "big-Q8_0.gguf"
    size = len(hub.repos[repo].files[f])
    hub.stall(repo, f, CHUNK + 1000)
    p = popen("pull", repo)
    have = _wait_for_part(hf_cache / "models--org--big-GGUF" / "blobs", hub.repos[repo].etag(f), CHUNK, p)
    p.kill()                                    # kill -9: no handler runs
    p.communicate(timeout=60)
    hub.unstall()
    assert list_models() == []
    r = tinychat("pull", repo)
    assert r.returncode == 0, r.stderr
    last = hub.requests("GET", f)[-1]
    assert last.range == f"bytes={have}-" and last.sent == size - have
    assert [m["name"] for m in list_models()] == ["big-Q8_0"]


def test_offline_and_import_by_repo_id_use_the_cache_alone(tinychat, hub, env):
    r = tinychat("pull", "org/tiny", "--offline")
    assert r.returncode == 2 and not hub.log
    assert "org/tiny is not in the Hugging Face cache" in r.stderr and "tinychat pull org/tiny downloads it" in r.stderr
    r = tinychat("import", "org/tiny")
    assert r.returncode == 2 and "tinychat pull org/tiny downloads it" in r.stderr
    assert tinychat("pull", "org/tiny").returncode == 0
    shutil.rmtree(paths.models_dir() / "tiny")
    n = len(hub.log)
    down = {**env, "HF_ENDPOINT": "http://127.0.0.1:9"}     # nothing listens there
    r = tinychat("pull", "org/tiny", env=down)
    assert r.returncode == 2 and r.stderr.startswith("tinychat: error: cannot reach http://127.0.0.1:9")
    assert r.stderr.strip().endswith("it is in the cache: tinychat pull org/tiny --offline")
    r = tinychat("models", env=down)            # the cache's importable repos, not imported (the GGUF never fetched)
    assert r.returncode == 0 and "no imported models" in r.stdout
    assert [x.split()[2] for x in r.stdout.splitlines() if x.startswith("  tinychat import")] == ["org/tiny"]
    r = tinychat("pull", "org/tiny", "--offline", env=down)
    assert r.returncode == 0, r.stderr
    r = tinychat("import", "org/tiny", "--name", "again", env={**down, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr
    assert "imported org/tiny from the Hugging Face cache as again" in r.stdout
    assert len(hub.log) == n
    assert sorted(m["name"] for m in list_models()) == ["again", "tiny"]
    assert _model("again")[1]["hub"]["commit"] == hub.repos["org/tiny"].commit
    r = tinychat("models", env=down)
    assert "tinychat import" not in r.stdout       # imported now


def test_unknown_repo_revision_and_no_network_are_one_line_errors(tinychat, hub, env):
    r = tinychat("pull", "org/missing")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert f"org/missing: no such model on {hub.url}" in r.stderr
    r = tinychat("pull", "org/tiny@v9")
    assert r.returncode == 2 and "org/tiny has no revision 'v9'" in r.stderr
    r = tinychat("pull", "not a repo")
    assert r.returncode == 2 and "is not a Hugging Face model: give it as ORG/NAME" in r.stderr
    r = tinychat("pull", "org/tiny", env={**env, "HF_ENDPOINT": "http://127.0.0.1:9"})     # nothing listens there
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert r.stderr.startswith("tinychat: error: cannot reach http://127.0.0.1:9") and "--offline" not in r.stderr


def test_a_gated_repo_needs_hf_token(tinychat, hub, env, repos):
    hub.add("org/gated", repos["org/tiny"], token="hf_secret")
    r = tinychat("pull", "org/gated")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert f"org/gated is gated: accept its terms at {hub.url}/org/gated, then set HF_TOKEN" in r.stderr
    assert not any(x.path.endswith("model.safetensors") for x in hub.requests("GET"))
    r = tinychat("pull", "org/gated", env={**env, "HF_TOKEN": "hf_secret"})
    assert r.returncode == 0, r.stderr
    assert all(x.auth == "Bearer hf_secret" for x in hub.requests("GET", "/resolve/")[-5:])


def test_an_unsupported_architecture_is_refused_before_its_weights_download(tinychat, hub, repos):
    r = tinychat("pull", "org/gemma-like")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "org/gemma-like: model_type 'gemma2' is not a supported llama-family architecture" in r.stderr
    assert not hub.requests(None, "model.safetensors")
    r = tinychat("pull", "org/phi-GGUF")
    assert r.returncode == 2 and "org/phi-GGUF: model_type 'phi3' is not a supported" in r.stderr
    size = len(repos["org/phi-GGUF"]["phi-Q8_0.gguf"])
    assert sum(x.sent for x in hub.requests("GET", "phi-Q8_0.gguf")) < size // 2   # the header, not 16 MiB
    assert not hub.requests("HEAD", "phi-Q8_0.gguf") and list_models() == []


def test_a_disk_without_room_is_refused_with_the_figures(tinychat, hub, repos):
    hub.add("org/huge", repos["org/tiny"], sizes={"model.safetensors": 2 ** 55})      # 32 PiB claimed
    r = tinychat("pull", "org/huge")
    assert r.returncode == 2
    size, error = r.stderr.splitlines()                                         # the size first, then the refusal
    assert size.startswith("org/huge at ") and size.endswith("5 files, 32.0 PiB; the import writes ~160 KiB")
    assert error.startswith("tinychat: error: not enough disk space: org/huge needs 32.0 PiB") and "free" in error
    assert not hub.requests(None, "model.safetensors")
