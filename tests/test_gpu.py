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


def test_replay_timed_runs_the_program_and_times_each_dispatch():
    """The benchmarks' profile (gpu/native.py replay_timed): a recorded program submitted with
    a timestamp after each dispatch runs every dispatch once, in order (y = 2x + y three
    times, with a buffer copy between passes), and returns one non-negative time for each."""
    import math
    import struct

    from bitlora import gpu

    dev = gpu.run(gpu.get_device("native"))
    if not dev.backend.can_time:
        pytest.skip("this adapter has no timestamps inside passes")

    async def run():
        n = 1000
        k = await dev.kernel("hello.wgsl", "axpy")
        x = dev.buffer(4 * n, "x", struct.pack(f"<{n}f", *range(n)))
        y, z = dev.buffer(4 * n, "y"), dev.buffer(4 * n, "z")
        params = struct.pack("<fI", 2.0, n)

        def step():
            dev.dispatch(k, [x, y], groups=gpu.groups_1d(-(-n // 256)), params=params)
            dev.dispatch(k, [x, y], groups=gpu.groups_1d(-(-n // 256)), params=params)
            dev.copy(y, z)
            dev.dispatch(k, [x, z], groups=gpu.groups_1d(-(-n // 256)), params=params)
        prog = dev.record(step)
        await dev.sync()
        secs = dev.backend.replay_timed(prog.prepared)
        return secs, struct.unpack(f"<{n}f", await dev.read(y)), struct.unpack(f"<{n}f", await dev.read(z))

    secs, y, z = gpu.run(run())
    assert len(secs) == 3 and all(math.isfinite(s) and s >= 0 for s in secs)
    assert y == tuple(4.0 * i for i in range(1000))
    assert z == tuple(6.0 * i for i in range(1000))


def test_fresh_kernels_bind_their_own_groups(run_case):
    """Bind groups are cached per Kernel, never by an address a dropped Kernel can hand on."""
    assert run_case("hello_cases", "case_fresh_kernels_bind_their_own_groups") == list(range(1, 25))


def test_failed_submit_starts_clean(run_case):
    """Natively the submit raises and the read waiting on it raises the same; in the browser
    validation errors arrive asynchronously, so the first call that looks raises."""
    r = run_case("hello_cases", "case_failed_submit_starts_clean")
    assert r["errors"] and all("16" in e and "32" in e for e in r["errors"]), r
    assert r["after"] == [2.0 * i + 1.0 for i in range(8)], r


def test_destroy_submits_what_binds_it(run_case):
    assert run_case("hello_cases", "case_destroy_submits_what_binds_it") == [3.0, 6.0, 9.0, 12.0]
