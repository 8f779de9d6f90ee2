"""The size check every op wrapper uses, the widths test of kernel_specs' `shapes` and the
spare buffers bound for absent bindings (browser-safe)."""

SPARES = 5   # matvec's three parts + the LoRA adapter + the gate


def need(b, n: int, what: str, op: str) -> None:
    """Raise unless buffer (or view) `b` holds at least n 32-bit words."""
    if b.size < 4 * n:
        raise ValueError(f"{op}: {what} holds {b.size // 4} words, needs {n}")


def quads(shapes: dict | None, *names: str, by: int = 4) -> bool:
    """Whether `shapes` (kernel_specs') are given and its widths `names` are all multiples of
    `by`: then a CPU adapter runs only a family's CPU variants (the GPU kernels are their
    fallback for other widths)."""
    return shapes is not None and all(shapes[n] is not None and shapes[n] % by == 0 for n in names)


def spare(dev, i: int):
    """A 16-byte buffer bound where a part, the LoRA adapter, the gate or an optional output is
    absent (i < SPARES; written outputs must be distinct buffers)."""
    bufs = getattr(dev, "_matvec_spares", None)
    if bufs is None:
        bufs = dev._matvec_spares = [dev.buffer(16, f"matvec_spare{j}") for j in range(SPARES)]
    return bufs[i]
