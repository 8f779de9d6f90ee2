"""The foundation: one kernel and WGSL error reporting, natively and in the browser."""
import pytest


def test_adapter_is_real(run_case, backend):
    r = run_case("hello_cases", "case_adapter")
    info = " ".join(str(v) for v in r["info"].values()).lower()
    assert r["backend"] == backend
    assert info.strip(), "the adapter describes nothing"
    if backend == "browser":
        # Chromium here runs WebGPU on SwiftShader; on a real machine, a GPU vendor.
        assert "mock" not in info and ("swiftshader" in info or r["info"]["vendor"]), r["info"]
    assert r["limits"]["maxStorageBufferBindingSize"] >= 128 * 1024 * 1024


@pytest.mark.parametrize("n", [1, 255, 257, 100_003])
def test_axpy(run_case, n):
    out = run_case("hello_cases", "case_axpy", n=n)
    want = [2.0 * (i % 97) + 1.0 + 0.5 * (i % 97) for i in range(n)]
    assert out == want


def test_wgsl_syntax_error_raises_with_compiler_message(run_case):
    msg = run_case("hello_cases", "case_syntax_error")
    assert "broken.wgsl" in msg
    assert "expected" in msg.lower(), msg  # the compiler's own words (naga / Tint)


def test_kernel_compiled_once(run_case):
    assert run_case("hello_cases", "case_compile_once") == 0


def test_prepare_compiles_each_module_and_pipeline_once(run_case):
    r = run_case("hello_cases", "case_prepare_once")
    assert r["again"] == 0 and r["modules"] == 0 and r["pipelines"] == 0, r
    assert "rope.wgsl:no_such_entry" in r["message"] and "prepare" in r["message"], r["message"]


def test_adapter_kind_table():
    """CPU implementations of WebGPU get the CPU-shaped kernels; GPUs the others."""
    from bitlora import gpu
    from bitlora.gpu.device import adapter_kind
    assert adapter_kind({"vendor": "llvmpipe", "device": "llvmpipe (LLVM 15.0.6, 256 bits)",
                         "description": "Mesa 22.3.6 (LLVM 15.0.6)", "adapter_type": "CPU"}) == "cpu"
    assert adapter_kind({"vendor": "google", "architecture": "swiftshader", "device": "", "description": ""}) == "cpu"
    assert adapter_kind({"vendor": "microsoft", "description": "Microsoft Basic Render Driver"}) == "cpu"
    assert adapter_kind({"vendor": "", "description": "", "is_fallback": True}) == "cpu"
    assert adapter_kind({"vendor": "nvidia", "architecture": "hopper", "device": "NVIDIA H200",
                         "description": "", "adapter_type": "DiscreteGPU"}) == "gpu"
    assert adapter_kind({"vendor": "apple", "architecture": "metal-3"}) == "gpu"
    dev = gpu.run(gpu.get_device("native"))
    assert dev.kind == adapter_kind(dev.adapter_info)
