"""Every compute entry point fits WebGPU's default limits on workgroup memory, storage
buffers and invocations, read from the WGSL sources (with the prelude, as gpu/device.py
compiles them). The page runs on any adapter a browser offers, and a browser may offer
only the defaults (16 KiB of workgroup memory, 8 storage buffers, 256 invocations);
wgpu-native does not check a pipeline's workgroup memory, so a kernel over it would
pass every native test and fail on such a device."""
from __future__ import annotations

import importlib.resources
import re

import pytest

from bitlora.gpu.device import read_shader

MAX_WORKGROUP_BYTES = 16384      # WebGPU's default maxComputeWorkgroupStorageSize
MAX_INVOCATIONS = 256            # ... and maxComputeInvocationsPerWorkgroup
MAX_STORAGE_BUFFERS = 8          # ... and maxStorageBuffersPerShaderStage

SCALARS = {"f32": (4, 4), "i32": (4, 4), "u32": (4, 4), "f16": (2, 2), "atomic<u32>": (4, 4),
           "atomic<i32>": (4, 4)}


def shader_files() -> list[str]:
    files = importlib.resources.files("bitlora.shaders")
    return sorted(f.name for f in files.iterdir() if f.name.endswith(".wgsl") and f.name != "prelude.wgsl")


def strip_comments(src: str) -> str:
    return re.sub(r"//[^\n]*", "", src)


def constants(src: str) -> dict[str, int]:
    """The module's integer constants (const NAME: T = expr; overrides by their default)."""
    out: dict[str, int] = {}
    for name, expr in re.findall(r"\b(?:const|override)\s+(\w+)\s*(?::\s*\w+)?\s*=\s*([^;]+);", src):
        expr = re.sub(r"\b(\d+)u\b", r"\1", expr)
        try:
            out[name] = int(eval(expr, {"__builtins__": {}}, dict(out)))   # noqa: S307 (our own sources)
        except Exception:
            pass   # floats, booleans, expressions of builtins: not sizes
    return out


def split_type(t: str) -> tuple[str, str]:
    """array<ELEM, N> -> (ELEM, N), commas inside ELEM's brackets kept."""
    inner = t[len("array<"):-1]
    depth = 0
    for i, ch in enumerate(inner):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "," and depth == 0:
            return inner[:i].strip(), inner[i + 1:].strip()
    raise ValueError(f"runtime-sized workgroup array {t}")


def size_align(t: str, consts: dict[str, int]) -> tuple[int, int]:
    """WGSL's SizeOf and AlignOf of the types our workgroup variables use."""
    t = t.replace(" ", "")
    if t in SCALARS:
        return SCALARS[t]
    m = re.fullmatch(r"vec([234])<(\w+)>", t)
    if m:
        n, (s, _) = int(m.group(1)), SCALARS[m.group(2)]
        return n * s, (2 if n == 2 else 4) * s
    if t.startswith("array<"):
        elem, count = split_type(t)
        es, ea = size_align(elem, consts)
        n = int(eval(re.sub(r"\b(\d+)u\b", r"\1", count), {"__builtins__": {}}, consts))   # noqa: S307
        return n * -(-es // ea) * ea, ea
    raise ValueError(f"workgroup type {t} not sized by this test")


def functions(src: str) -> dict[str, str]:
    """fn name -> its body (braces matched)."""
    out = {}
    for m in re.finditer(r"\bfn\s+(\w+)\s*\(", src):
        start = src.index("{", m.end())
        depth, i = 0, start
        while True:
            depth += src[i] == "{"
            depth -= src[i] == "}"
            if depth == 0:
                break
            i += 1
        out[m.group(1)] = src[m.end():i]
    return out


def entry_points(src: str) -> dict[str, str]:
    """@compute entry -> its @workgroup_size arguments."""
    return {name: size for size, name in
            re.findall(r"@compute\s*@workgroup_size\(([^)]*)\)\s*fn\s+(\w+)", src)}


def reached(src: str) -> dict[str, set]:
    """Each entry point's identifiers, through the functions it calls."""
    fns = functions(src)
    out = {}
    for entry in entry_points(src):
        seen, todo, words = set(), [entry], set()
        while todo:
            f = todo.pop()
            if f in seen:
                continue
            seen.add(f)
            w = set(re.findall(r"\b\w+\b", fns[f]))
            words |= w
            todo += [g for g in w & fns.keys() if g != f]
        out[entry] = words
    return out


def workgroup_bytes(src: str) -> dict[str, int]:
    """Each entry point's workgroup memory: the variables it reaches through its calls,
    each rounded up to 16 bytes (as the WebGPU spec counts them)."""
    consts = constants(src)
    wg = {name: size_align(t, consts)[0] for name, t in
          re.findall(r"var<workgroup>\s+(\w+)\s*:\s*([^;]+);", src)}
    return {entry: sum(-(-wg[v] // 16) * 16 for v in words & wg.keys()) for entry, words in reached(src).items()}


def storage_bindings(src: str) -> dict[str, set]:
    """Each entry point's storage buffer bindings (group, binding) that it reaches."""
    var = {name: (g, b) for g, b, name in
           re.findall(r"@group\((\d+)\)\s*@binding\((\d+)\)\s*var<storage[^>]*>\s+(\w+)", src)}
    return {entry: {var[v] for v in words & var.keys()} for entry, words in reached(src).items()}


@pytest.mark.parametrize("shader", shader_files())
def test_workgroup_memory_fits_the_default_limit(shader):
    src = strip_comments(read_shader(shader))
    sizes = workgroup_bytes(src)
    assert sizes and len(sizes) == src.count("@compute"), f"{shader}: entry points {sorted(sizes)} not all read"
    over = {e: b for e, b in sizes.items() if b > MAX_WORKGROUP_BYTES}
    assert not over, f"{shader}: workgroup memory over {MAX_WORKGROUP_BYTES} bytes: {over}"


@pytest.mark.parametrize("shader", shader_files())
def test_storage_buffers_fit_the_default_limit(shader):
    src = strip_comments(read_shader(shader))
    over = {e: len(b) for e, b in storage_bindings(src).items() if len(b) > MAX_STORAGE_BUFFERS}
    assert not over, f"{shader}: more than {MAX_STORAGE_BUFFERS} storage buffers: {over}"


@pytest.mark.parametrize("shader", shader_files())
def test_workgroup_size_fits_the_default_limit(shader):
    src = strip_comments(read_shader(shader))
    consts = constants(src)
    for entry, dims in entry_points(src).items():
        n = 1
        for d in dims.split(","):
            if d.strip():
                n *= int(eval(re.sub(r"\b(\d+)u\b", r"\1", d), {"__builtins__": {}}, consts))   # noqa: S307
        assert n <= MAX_INVOCATIONS, f"{shader}:{entry} has {n} invocations"


def test_the_reader_counts_what_an_entry_reaches():
    """The analysis itself: a variable reached through a helper counts, an unreached one
    does not, arrays take their element stride."""
    src = strip_comments("""
const N: u32 = 4u;
const M: u32 = N * 2u + 1u;
var<workgroup> a: array<vec4<f32>, M>;         // 9 * 16
var<workgroup> b: array<array<f32, 3>, N>;     // 48
var<workgroup> c: array<vec3<f32>, 2>;         // 32 (vec3 stride 16), unreached
fn helper() -> f32 { return b[0][1]; }
@compute @workgroup_size(8, 8) fn k1() { a[0] = vec4<f32>(helper()); }
@compute @workgroup_size(64) fn k2() { c[1] = vec3<f32>(1.0); }
""")
    assert workgroup_bytes(src) == {"k1": 144 + 48, "k2": 32}
    src = strip_comments("""
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<storage, read_write> y4: array<vec4<f32>>;   // the same binding seen as vec4
fn put(i: u32) { y[i] = x[i]; }
@compute @workgroup_size(64) fn k1() { put(0u); }
@compute @workgroup_size(64) fn k2() { y4[0] = vec4<f32>(x[0]); }
""")
    assert storage_bindings(src) == {"k1": {("0", "1"), ("0", "2")}, "k2": {("0", "1"), ("0", "2")}}
