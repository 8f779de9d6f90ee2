"""Each kernel's uniform is declared once in Python (ops/*.py, a `Uniform`) and once in
WGSL (the struct bound as `var<uniform>`): the two must agree field for field. Also:
every kernel spec that bitlora.ops lists names an entry point of its shader file.
Pure Python, no GPU."""
import importlib
import importlib.resources
import pkgutil
import re

import pytest

import bitlora.ops
from bitlora import ops
from bitlora.ops import adamw, grad_norm, hello
from bitlora.ops._uniform import Uniform

SHADERS = importlib.resources.files("bitlora.shaders")
FILES = sorted(p.name for p in SHADERS.iterdir() if p.name.endswith(".wgsl"))


def wgsl(name: str) -> str:
    return re.sub(r"//[^\n]*", "", SHADERS.joinpath(name).read_text())


def structs(text: str) -> dict:
    """{struct name: [(field, type), ...]} of a WGSL source."""
    out = {}
    for name, body in re.findall(r"struct\s+(\w+)\s*\{([^}]*)\}", text):
        out[name] = [tuple(x.strip() for x in f.split(":")) for f in body.split(",") if f.strip()]
    return out


def uniform_structs() -> dict:
    """{struct name: (file, fields)} of every struct bound as a uniform in shaders/."""
    prelude = structs(wgsl("prelude.wgsl"))
    found = {}
    for f in FILES:
        text = wgsl(f)
        local = {**prelude, **structs(text)}
        for ty in re.findall(r"var<uniform>\s+\w+\s*:\s*(\w+)\s*;", text):
            assert ty in local, f"{f}: uniform struct {ty} is not declared"
            assert ty not in found or found[ty][0] == f, f"struct {ty} is bound as a uniform in two files"
            found[ty] = (f, local[ty])
    return found


def python_uniforms() -> dict:
    out = {}
    for info in pkgutil.iter_modules(bitlora.ops.__path__):
        mod = importlib.import_module(f"bitlora.ops.{info.name}")
        for obj in vars(mod).values():
            if isinstance(obj, Uniform):
                assert out.get(obj.name, obj) is obj, f"Uniform {obj.name} declared twice"
                out[obj.name] = obj
    return out


def test_every_wgsl_uniform_matches_its_python_declaration():
    wg, py = uniform_structs(), python_uniforms()
    assert len(wg) >= 25
    assert sorted(wg) == sorted(py), (f"only in WGSL: {sorted(set(wg) - set(py))}; "
                                      f"only in Python: {sorted(set(py) - set(wg))}")
    for name, (f, fields) in wg.items():
        assert list(py[name].fields) == fields, f"{f} struct {name} {fields} vs Python {py[name].fields}"


def test_uniform_pack_checks_arity():
    u = Uniform("T", "n:u32 eps:f32")
    assert u.pack(3, 0.5) == b"\x03\0\0\0\0\0\0?"
    with pytest.raises(TypeError, match="n eps"):
        u.pack(3)


@pytest.mark.parametrize("table_dtype", ["f32", "bf16"])
@pytest.mark.parametrize("training", [False, True])
def test_kernel_specs_name_real_entry_points(table_dtype, training):
    specs = ops.kernel_specs(table_dtype, training, int8=True) + grad_norm.kernel_specs(1024) + adamw.kernel_specs() \
        + hello.kernel_specs()
    for shader, entry, *constants in specs:
        assert re.search(rf"@compute[^\n]*\n\s*fn {entry}\(", wgsl(shader)), f"{shader} has no entry point {entry}"
        for name in (constants[0] or {}) if constants else {}:
            assert re.search(rf"override {name}\b", wgsl(shader)), f"{shader} has no override {name}"
    entries = {e for _, e, *_ in specs}
    if training:
        assert {"rmsnorm_backward", "bitlinear_backward_input", "linear_backward_input", "attention_backward_dkv",
                "rope_backward", "relu2_gating_backward", "cross_entropy_forward_backward", "lora_grad_x",
                "splitk_reduce"} <= entries


def test_no_shader_repeats_a_prelude_helper():
    prelude = wgsl("prelude.wgsl")
    names = set(re.findall(r"\bfn (\w+)\(", prelude)) | set(re.findall(r"\b(?:const|struct) (\w+)", prelude))
    for f in FILES:
        if f != "prelude.wgsl":
            mine = set(re.findall(r"\bfn (\w+)\(", wgsl(f))) | set(re.findall(r"\b(?:const|struct) (\w+)", wgsl(f)))
            assert not names & mine, f"{f} redeclares {names & mine} (shaders/prelude.wgsl has them)"
