"""Where a tinychat command's resident memory goes: runs `tinychat ARGS` in this process with a thread sampling
/proc/self/statm every few ms. Prints the resident memory by kind (heap, anonymous, mapped weight files) after each
load stage (the model, the tokenizer, the runtime, the chat), the peak sample (file-backed / anonymous) and the
Python stack of the main thread then, the largest tensors outside the weight files (and which mapping holds them,
how much of it resident), the largest mappings at the end and after a malloc_trim (what the heap keeps freed).
torch's allocations are invisible to tracemalloc, hence /proc. Linux only. Not a test.

    python tests/perf/rss_peak.py -p hi --max-new 8 --model DIR --no-save --temperature 0"""
from __future__ import annotations

import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


PAGE_KB = 4


def rollup() -> dict[str, int]:
    """Resident kB from /proc/self/statm (cheap enough to sample): all, file-backed (+ shmem), anonymous."""
    with open("/proc/self/statm") as f:
        _, rss, shared, *_ = (int(x) for x in f.read().split())
    return {"Rss": rss * PAGE_KB, "Rss_File": shared * PAGE_KB, "Rss_Anon": (rss - shared) * PAGE_KB}


def by_mapping(top: int = 10) -> list[tuple[int, str]]:
    """The top resident kB of /proc/self/smaps summed per path ([heap], [anon] for nameless mappings)."""
    sums: dict[str, int] = {}
    name = "?"
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and len(parts) >= 5 and not parts[0].endswith(":"):
                name = parts[5] if len(parts) > 5 else "[anon]"
            elif parts[0] == "Rss:":
                sums[name] = sums.get(name, 0) + int(parts[1])
    return sorted(((v, k) for k, v in sums.items()), reverse=True)[:top]


def heap_tensors(top: int = 15) -> list[str]:
    """The largest tensor storages Python objects reach that are not in a mapped weight file (one line each)."""
    import gc
    import warnings

    import torch
    warnings.simplefilter("ignore")         # isinstance on deprecated torch module attributes warns
    from tinychat.mapped import MappedWeights
    mapped = MappedWeights()
    seen: dict[int, tuple[int, str]] = {}
    for o in gc.get_objects():
        if isinstance(o, torch.Tensor) and o.device.type == "cpu" and not o.is_sparse:
            try:
                st = o.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            if st.nbytes() == 0 or mapped.holds(o):
                continue
            ptr = st.data_ptr()
            if ptr not in seen or seen[ptr][0] < st.nbytes():
                seen[ptr] = (st.nbytes(), f"{tuple(o.shape)} {o.dtype}")
    maps = []
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and not parts[0].endswith(":"):
                a, b = (int(x, 16) for x in parts[0].split("-"))
                maps.append([a, b, parts[5] if len(parts) > 5 else "[anon]", 0])
            elif parts[0] == "Rss:":
                maps[-1][3] = int(parts[1])
    for ptr, (n, what) in list(seen.items()):
        m = next((m for m in maps if m[0] <= ptr < m[1]), None)
        if m is not None:
            seen[ptr] = (n, f"{what}  in {m[2]} of {(m[1] - m[0]) >> 10:,} kB, {m[3]:,} kB resident")
    total = sum(n for n, _ in seen.values())
    lines = [f"  tensors outside the file: {len(seen)} storages, {total / 2**20:,.1f} MiB"]
    for n, what in sorted(seen.values(), reverse=True)[:top]:
        lines.append(f"    {n / 2**20:9.2f} MiB  {what}")
    return lines


def stage_line(what: str) -> str:
    sums = dict((k, v) for v, k in by_mapping(1000))
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
    files = sum(v for k, v in sums.items() if k.endswith(".safetensors"))
    return (f"  after {what:<22} heap {sums.get('[heap]', 0):>9,} anon {sums.get('[anon]', 0):>9,} "
            f"weights {files:>9,} all {sum(sums.values()):>10,} peak {hwm:>10,} kB")


def staged(owner, name: str) -> None:
    """Print the resident memory after each call of owner.name."""
    fn = getattr(owner, name)

    def wrapper(*a, **kw):
        out = fn(*a, **kw)
        print(stage_line(name), file=sys.stderr)
        return out
    setattr(owner, name, wrapper)


def main() -> int:
    main_id = threading.get_ident()
    best = {"Rss": 0}
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            r = rollup()
            if r.get("Rss", 0) > best["Rss"]:
                frame = sys._current_frames().get(main_id)
                best.clear()
                best.update(r)
                best["stack"] = "".join(traceback.format_stack(frame)[-8:]) if frame else ""
            time.sleep(0.003)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    import tinychat.cli as cli_mod
    import tinychat.loading as loading
    import tinychat.tokenizer as tokenizer
    from tinychat.cli import main as cli
    staged(cli_mod, "load_runtime")
    staged(cli_mod, "open_chat")
    staged(loading, "load_folder")
    staged(tokenizer.Tokenizer, "from_file")
    print(stage_line("imports"), file=sys.stderr)
    rc = 0
    sys.argv = ["tinychat", *sys.argv[1:]]
    try:
        cli()
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    stop.set()
    t.join()
    end = rollup()
    with open("/proc/self/status") as f:
        hwm = next(line.split()[1] for line in f if line.startswith("VmHWM"))
    keys = ("Rss", "Rss_File", "Rss_Anon")
    for what, r in (("peak sample", best), ("end", end)):
        print(f"{what}: " + ", ".join(f"{k} {r.get(k, 0):,} kB" for k in keys if k in r), file=sys.stderr)
    print(f"VmHWM {int(hwm):,} kB ({int(hwm) * 1024 / 2**30:.3f} GiB, {int(hwm) * 1024 / 1e9:.3f} GB)",
          file=sys.stderr)
    print("\n".join(heap_tensors()), file=sys.stderr)
    for kb, path in by_mapping():
        print(f"  end {kb:>10,} kB  {path}", file=sys.stderr)
    import ctypes
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    print("after malloc_trim(0):", file=sys.stderr)
    for kb, path in by_mapping(3):
        print(f"  end {kb:>10,} kB  {path}", file=sys.stderr)
    print("main thread at the peak sample:\n" + best.get("stack", ""), file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
