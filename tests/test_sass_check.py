"""Issue 36 on the CPU: the machine-code (SASS) check, the PTX tokenizer and residency detection.

Kernels are compiled here by NVRTC (the evaluator's own child-side helper) for sm_90a and sm_80 and
judged by :mod:`evaluators.compile._sass` through the real ``nvdisasm`` (the nvidia-cuda-nvdisasm wheel
of the dev extra): each forbidden special register, driver constant-bank word and kind of module data
is refused, honest reads pass, and every template's first picks on both targets compile ``ok``.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from populations import Candidate, LaunchPlan, Shape, Status, load_templates

pytest.importorskip("cuda.bindings")
from evaluators import CompilePool, compile_candidate  # noqa: E402
from evaluators.compile import cuda_tool  # noqa: E402
from evaluators.compile._backends import flags_for  # noqa: E402
from evaluators.compile._isolate import _nvrtc_compile  # noqa: E402
from evaluators.compile._ptxscan import blank_ptx, scan_ptx  # noqa: E402
from evaluators.compile._sass import (SassUnavailable, check_cubin, disassemble, module_references,  # noqa: E402
                                     waiting_kernels)
from evaluators.compile._toolkit import nvrtc_library  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hostile_corpus import load_corpus  # noqa: E402

NVDISASM = cuda_tool("nvdisasm")
needs_nvdisasm = pytest.mark.skipif(NVDISASM is None, reason="no nvdisasm (install the dev extra's nvidia-cuda-nvdisasm)")
ARCHS = ("sm_90a", "sm_80")


def build(source: str, arch: str) -> tuple[bytes, str]:
    """(cubin, ptx) of ``source`` for ``arch``, compiled the way the compile child does."""
    ok, cubin, log, ptx = _nvrtc_compile(source, list(flags_for("nvrtc", arch)), nvrtc_library())
    assert ok, log
    return cubin, ptx


def reads(reg: str, wide: bool = False) -> str:
    """A kernel that stores one PTX special register (or expression ``reg`` names) per thread."""
    ty, c, decl = ("u64", "l", "unsigned long long") if wide else ("u32", "r", "unsigned")
    return (f'extern "C" __global__ void k(unsigned long long* o) {{ {decl} v; '
            f'asm volatile("mov.{ty} %0, %%{reg};" : "={c}"(v)); o[threadIdx.x] = v; }}\n')


def judge(source: str, arch: str) -> tuple[list[str], dict[str, str]]:
    return check_cubin(build(source, arch)[0], NVDISASM, arch)


# -- what the machine code must not read ---------------------------------------------------------
FORBIDDEN = [("clock", False, "SR_CLOCKLO"), ("clock64", True, "SR_CLOCKLO"), ("clock_hi", False, "SR_CLOCKHI"),
             ("globaltimer", True, "SR_GLOBALTIMER"), ("globaltimer_lo", False, "SR_GLOBALTIMERLO"),
             ("globaltimer_hi", False, "SR_GLOBALTIMERHI"), ("smid", False, "SR_VIRTUALSMID"),
             ("warpid", False, "SR_VIRTID"), ("pm0", False, "SR_PM0"), ("pm3_64", True, "SR_PM3"),
             ("gridid", True, "grid id"), ("envreg0", False, "%envreg"), ("envreg31", False, "%envreg"),
             ("current_graph_exec", True, "graph handle")]


@needs_nvdisasm
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("reg, wide, words", FORBIDDEN, ids=[f[0] for f in FORBIDDEN])
def test_each_forbidden_register_or_driver_word_is_refused(reg: str, wide: bool, words: str, arch: str) -> None:
    """Also pins :data:`DRIVER_SLOTS` to this toolkit: a ptxas that moved %gridid fails here."""
    refused, _ = judge(reads(reg, wide), arch)
    assert any(words in r for r in refused), refused


MODULE_DATA = {
    "__device__ variable": ('__device__ unsigned evo_n;\n', 'o[0] = atomicAdd(&evo_n, 1u);', "(evo_n)"),
    "const table": ('__device__ const unsigned evo_t[2] = {1u, 2u};\n', 'o[0] = evo_t[threadIdx.x & 1];', "(evo_t)"),
    "static local": ('', 'static __device__ unsigned n; o[0] = n++;', "module-scope global data"),
    "string literal": ('', 'const char* s = "abcd"; o[0] = s[threadIdx.x & 3];', "a string literal"),
    "constant window (cvta.const)": ('__constant__ unsigned evo_c[4];\n',
                                     'o[0] = (unsigned)(unsigned long long)(const void*)&evo_c[threadIdx.x & 3];',
                                     "generic address of __constant__"),
    "printf": ('extern "C" __device__ int vprintf(const char*, void*);\n', 'vprintf((const char*)o, nullptr);',
               "vprintf"),
}


@needs_nvdisasm
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("what", sorted(MODULE_DATA))
def test_module_data_and_calls_out_are_refused(what: str, arch: str) -> None:
    decl, body, words = MODULE_DATA[what]
    refused, _ = judge(decl + 'extern "C" __global__ void k(unsigned* o) { ' + body + " }\n", arch)
    assert any(words in r for r in refused), refused


@needs_nvdisasm
@pytest.mark.parametrize("arch", ARCHS)
def test_honest_reads_pass(arch: str) -> None:
    """Thread/block ids, lanes, sizes, %nsmid, __constant__ read in place, shared memory, nanosleep
    outside a loop and atomics on a parameter pass; atomicExch leaves the CUDA headers' helper global
    in the sm_90a global-address table, relocated but read by no instruction: allowed."""
    cluster = ('unsigned r; asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); acc += r;' if arch == "sm_90a" else "")
    src = ('__constant__ unsigned evo_c[4];\n'
           'extern "C" __global__ void k(unsigned* o, const unsigned* x) { __shared__ unsigned sh[32];\n'
           '  unsigned acc = evo_c[threadIdx.x & 3] + blockIdx.x + blockDim.x + gridDim.y;\n'
           '  unsigned v; asm("mov.u32 %0, %%laneid;" : "=r"(v)); acc += v;\n'
           '  asm("mov.u32 %0, %%nsmid;" : "=r"(v)); acc += v;\n'
           '  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(v)); acc += v;\n'
           f'  {cluster}\n'
           '  sh[threadIdx.x & 31] = acc; __syncthreads(); __nanosleep(10);\n'
           '  atomicAdd(o + 1, sh[(threadIdx.x + 1) & 31]); atomicExch(o, 5u); o[threadIdx.x + 2] = x[threadIdx.x];\n}\n')
    cubin, _ = build(src, arch)
    if arch == "sm_90a":  # CUDA 13's headers leave the helper there for sm_90 (not for sm_80)
        assert any("__nv_atomic_triv_cp_helper" in why for _, _, why in module_references(cubin))
    assert check_cubin(cubin, NVDISASM, arch) == ([], {})


# -- the PTX tokenizer -----------------------------------------------------------------------------
PTX = ".version 9.0\n.target sm_90a\n.address_size 64\n.visible .entry k()\n{\n.reg .b64 %rd<4>;\n{}\nret;\n}\n"


@pytest.mark.parametrize("line", [
    '.pragma "//"; mov.u64 %rd1, %globaltimer;',                      # on the line after a "comment"
    '.pragma "/*";\nmov.u64 %rd1, %globaltimer;\n.pragma "*/";',       # between two of them
    '.pragma "a\\"//"; mov.u64 %rd1, %globaltimer;',                   # an escaped quote inside
])
def test_tokenizer_sees_past_comment_like_strings(line: str) -> None:
    reasons = scan_ptx(PTX.replace("{}", line))
    assert any("global timer" in r for r in reasons), reasons
    assert any("comment marker" in r for r in reasons), reasons


def test_tokenizer_blanks_strings_and_comments_and_refuses_what_it_cannot_close() -> None:
    text, problems = blank_ptx('.pragma "nounroll"; // "%clock" here\nmov.u32 %r1, 1; /* "x\n" */ add;')
    assert problems == [] and "%clock" not in text and '""' in text and "add;" in text and "mov.u32" in text
    assert scan_ptx(PTX.replace("{}", '.pragma "%globaltimer";')) == []  # a name in a string reads nothing
    assert "unterminated string" in blank_ptx('mov.u32 %r1, 1; .pragma "abc\n')[1][0]
    assert "unterminated comment" in blank_ptx('mov.u32 %r1, 1; /* abc')[1][0]
    assert any(".loc" in r for r in scan_ptx(PTX.replace("{}", ".loc 1 2 3;")))


BLINDED = {
    "timer after .pragma \"//\"": 'unsigned long long t; asm volatile(".pragma \\"//\\"; mov.u64 %0, %%glob" "altimer;" '
                                   ': "=l"(t)); o[0] = (unsigned)t;',
    "table between .pragma \"/*\" and \"*/\"": 'unsigned n; asm volatile(".pragma \\"/*\\";\\n\\tatom.global.add.u32 %0, '
                                               '[evo_t], 1;\\n\\t.pragma \\"*/\\";" : "=r"(n) :: "memory"); o[0] = n;',
}


@needs_nvdisasm
@pytest.mark.parametrize("what", sorted(BLINDED))
def test_blinding_directives_are_caught_by_the_ptx_scan_and_by_the_machine_code(what: str) -> None:
    src = '__device__ const unsigned evo_t[2] = {0u, 0u};\nextern "C" __global__ void k(unsigned* o) { ' + BLINDED[what] + " }\n"
    cubin, ptx = build(src, "sm_90a")
    assert any("comment marker" in r for r in scan_ptx(ptx))
    refused, _ = check_cubin(cubin, NVDISASM, "sm_90a")
    assert any("SR_GLOBALTIMER" in r or "(evo_t)" in r for r in refused), refused


# -- residency: kernels that may wait on other CTAs ------------------------------------------------
SPINS = {
    "volatile spin": "while (*(volatile unsigned*)flag == 0) {}",
    "atomic spin": "while (atomicAdd(flag, 0u) == 0u) {}",
    "acquire spin": 'unsigned v; do { asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(flag)); } while (!v);',
    "sleeping spin": "while (flag[1] < 3u) __nanosleep(100);",
}


@needs_nvdisasm
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("what", sorted(SPINS))
def test_spin_waits_are_found_and_honest_loops_are_not(what: str, arch: str) -> None:
    src = ('extern "C" __global__ void spin(unsigned* flag, float* c) { if (threadIdx.x == 0) { ' + SPINS[what]
           + ' } __syncthreads(); c[threadIdx.x] = 1.f; }\n'
           'extern "C" __global__ void honest(const float* a, float* c, unsigned* n, int k) { float s = 0.f;\n'
           '  for (int i = 0; i < k; ++i) s += a[i * blockDim.x + threadIdx.x];\n'
           '  c[threadIdx.x] = s; if (threadIdx.x == 0) atomicAdd(n, 1u); }\n')
    cubin, _ = build(src, arch)
    assert set(waiting_kernels(disassemble(cubin, NVDISASM))) == {"spin"}


# -- failing closed, and no false rejection --------------------------------------------------------
def test_without_a_disassembler_the_check_fails_closed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No nvdisasm: compile_error naming it, never ok, and not cached (the next machine may have one)."""
    import evaluators.compile._compile as comp

    with pytest.raises(SassUnavailable, match="nvdisasm"):
        disassemble(b"\x7fELF", None)
    monkeypatch.setattr(comp, "cuda_tool", lambda name: None)
    plan = LaunchPlan.from_dict({"launches": [{"kernel": "k", "grid": [1, 1, 1], "block": [32, 1, 1], "smem": 0,
                                               "args": ["C"]}], "workspace": 0})
    cand = Candidate(source='extern "C" __global__ void k(float* c) { c[threadIdx.x] = 1.f; }\n', plan=plan,
                     shapes=(Shape(64, 64, 64, "TN"),), generic=True)
    for _ in range(2):
        res = compile_candidate(cand, "sm_90a", cache_dir=tmp_path, timeout_s=60)
        assert res.status is Status.COMPILE_ERROR and not res.cached, res.message
        assert "machine-code check could not run" in res.message and "nvdisasm" in res.message


@needs_nvdisasm
def test_every_compile_case_the_ptx_scan_refuses_the_machine_code_refuses_too() -> None:
    """The PTX scan is only the early refusal: the SASS check alone catches the same corpus cases."""
    cases = [c for c in load_corpus() if c.phase == "compile" and c.expected is Status.REJECTED and c.candidate]
    assert len(cases) >= 10
    for case in cases:
        cubin, ptx = build(case.source, "sm_90a")
        assert scan_ptx(ptx) or "smid" in case.name, case.name
        refused, _ = check_cubin(cubin, NVDISASM, "sm_90a")
        assert refused, f"{case.name}: the machine code passed"


@needs_nvdisasm
def test_every_template_first_pick_is_ok_and_waits_exactly_when_it_says_coresident() -> None:
    """No false rejection on either target, and residency detection agrees with every honest plan."""
    jobs: dict[tuple[str, str], tuple[str, Candidate]] = {}
    for name, t in load_templates().items():
        for text in ("4096x4096x4096", "64x128x64", "5x4096x4104", "1000x1000x1000", "128x4096x4096"):
            shape = Shape.parse(text)
            for arch in ARCHS:
                if t.applicable(shape, arch):
                    for knobs in t.heuristic(shape, arch)[:1]:
                        cand = t.candidate(knobs, shape)
                        jobs.setdefault((cand.source, arch), (name, cand))
    with CompilePool(workers=2, use_cache=False) as pool:
        done = [(name, arch, cand, pool.submit(cand, arch)) for (_, arch), (name, cand) in jobs.items()]
        results = [(name, arch, cand, f.result()) for name, arch, cand, f in done]
    bad = [(n, a, r.status, r.message[-300:]) for n, a, _, r in results if not r.ok]
    assert not bad, bad
    assert {a for _, a, _, _ in results} == set(ARCHS) and len({n for n, _, _, _ in results}) >= 6
    disagree = [(n, a, c.plan.coresident, dict(r.waits_on_ctas)) for n, a, c, r in results
                if bool(r.waits_on_ctas) != c.plan.coresident]
    assert not disagree, disagree
    assert any(c.plan.coresident for _, _, c, _ in results)
