"""The size check every op wrapper uses (browser-safe)."""


def need(b, n: int, what: str, op: str) -> None:
    """Raise unless buffer (or view) `b` holds at least n 32-bit words."""
    if b.size < 4 * n:
        raise ValueError(f"{op}: {what} holds {b.size // 4} words, needs {n}")
