"""The int8 GEMV kernels built for other targets than this machine's own: each x86-64 level this CPU can run
(AVX-512 VNNI, AVX-512 without VNNI, AVX2 + AVX-VNNI, AVX2, baseline scalar) natively, and aarch64 (NEON, NEON dot product) under
qemu-user, each through tests/native/q8_harness.c against a float64 reference (tests/native_harness.py builds and
runs it). Skips where the compilers or qemu are absent (.ci/run installs gcc-aarch64-linux-gnu and qemu-user)."""
import shutil
import subprocess

import pytest

from native_harness import AARCH64, ENGINE, run_aarch64, run_x86, run_x86_out

HARNESS = "q8_harness.c"

X86 = [(["-march=x86-64-v4", "-mavx512vnni"], "avx512-vnni", {"avx512_vnni", "avx512bw"}),
       # AVX-512 without VNNI (Skylake-SP, x86-64-v4): the 256-bit dots beside the 16-lane float kernels
       (["-march=x86-64-v4"], "avx512", {"avx512f", "avx512bw", "avx512vl", "avx2", "fma"}),
       (["-march=x86-64-v3", "-mavxvnni"], "avx2-vnni", {"avx_vnni", "avx2"}),
       # the same 256-bit VNNI path in EVEX encoding: what an AVX-512 host without AVX-VNNI (Zen 4) can run of it
       (["-march=x86-64-v3", "-mavx512vnni", "-mavx512vl"], "avx2-vnni", {"avx512_vnni", "avx512vl", "avx2"}),
       (["-march=x86-64-v3"], "avx2", {"avx2", "fma"}),
       (["-march=x86-64"], "scalar", set())]


@pytest.mark.parametrize("flags,path,needs", X86, ids=[p + ("-evex" if "-mavx512vl" in f else "") for f, p, _ in X86])
def test_x86_kernel_paths_match_the_float64_reference(flags, path, needs, tmp_path):
    assert run_x86(HARNESS, flags, needs, tmp_path) == path


@pytest.mark.parametrize("flags,needs", [(["-march=native"], set()), (["-march=x86-64-v3"], {"avx2", "fma"})],
                         ids=["native", "avx2"])
def test_the_gemm_by_k_slabs_gives_the_bits_of_one_pass(flags, needs, tmp_path):
    """Past TC_SLAB super-blocks the GEMM runs K in slabs, its float accumulators kept between them (native_gemm.h's
    tc_chunk_run): every int8 and int4 GEMM output of the harness (K up to 5,000) has the bits of a build whose slab
    holds any K, so sessions prefilled before keep replaying exactly."""
    slabs = run_x86_out(HARNESS, flags, needs, tmp_path / "slabs")
    one = run_x86_out(HARNESS, [*flags, "-DTC_SLAB_BYTES=1073741824"], needs, tmp_path / "one")
    bits = [line for line in slabs.splitlines() if line.startswith("gemm bits")]
    assert len(bits) == 1 and bits[0] in one.splitlines()


@pytest.mark.parametrize("flags,path", AARCH64, ids=[p for _, p in AARCH64])
def test_aarch64_kernel_paths_match_the_float64_reference_under_qemu(flags, path, tmp_path):
    assert run_aarch64(HARNESS, flags, tmp_path) == path


def test_the_whole_kernel_source_builds_for_aarch64_and_without_openmp(tmp_path):
    """native.c as native.py builds it, for aarch64 (with OpenMP) and for x86 without OpenMP (Apple clang has none:
    the pragmas are ignored and the kernels run on one thread)."""
    from tinychat.engine import native
    done = 0
    for cc, arch, omp in (("aarch64-linux-gnu-gcc", ["-march=armv8.2-a+dotprod"], True),
                          ("gcc", ["-march=x86-64-v3"], False)):
        cc = shutil.which(cc)
        if cc is None:
            continue
        out = tmp_path / f"k{done}.so"
        r = subprocess.run([*native.build_cmd(cc, ENGINE / "native.c", out, arch, omp), "-Werror"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        done += 1
    if not done:
        pytest.skip("no compilers")


def test_every_kernel_path_the_simd_header_names_has_a_step_version():
    """native_simd.h names the path (TC_PATH) and native.py's KERNEL_PATHS gives each its step version: a path the
    header can build must be in the table, or a session from such a machine would be labelled with a guess."""
    import re
    from tinychat.engine import native
    text = (ENGINE / "native_simd.h").read_text()
    named = set(re.findall(r'#define TC_PATH "([^"]+)"', text))
    assert named == set(native.KERNEL_PATHS)
    assert native.step_version("avx512") == native.step_version("avx2") == native.INT8_STEP_VERSION
    with pytest.raises(ValueError, match="unknown int8 kernel path"):
        native.step_version("avx1024")


def test_no_kernel_but_the_simd_header_reads_the_compilers_feature_macros():
    """One place chooses the ISA: a kernel keyed on __AVX512F__ while the path is named from VNNI is how an AVX-512
    CPU without VNNI came to run AVX-512 attention under the name "avx2"."""
    import re
    for f in sorted(ENGINE.glob("native*.[ch]")):
        if f.name != "native_simd.h":
            assert not re.findall(r"__(AVX|FMA|ARM_|aarch64)\w*", f.read_text()), f.name
