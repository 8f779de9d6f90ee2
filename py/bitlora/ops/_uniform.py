"""A kernel's uniform layout, declared once (browser-safe).

    RMS = Uniform("RmsParams", "n:u32 c:u32 eps:f32")    # struct RmsParams in rmsnorm.wgsl
    dev.dispatch(k, [...], groups=N, params=RMS.pack(N, C, eps))

The name is the WGSL struct's; tests/test_uniforms.py checks every struct bound as
a uniform in shaders/ against its declaration here (field names, order, types).
Fields are 4-byte scalars, so the layout is the fields packed in order.
"""
from __future__ import annotations

import struct

_CODES = {"u32": "I", "i32": "i", "f32": "f"}


class Uniform:
    def __init__(self, name: str, fields: str):
        self.name = name
        self.fields = tuple(tuple(f.split(":")) for f in fields.split())
        self._struct = struct.Struct("<" + "".join(_CODES[t] for _, t in self.fields))

    def pack(self, *values) -> bytes:
        if len(values) != len(self.fields):
            raise TypeError(f"{self.name} has {len(self.fields)} fields "
                            f"({' '.join(n for n, _ in self.fields)}), got {len(values)} values")
        return self._struct.pack(*values)

    def __repr__(self) -> str:
        return f"Uniform({self.name!r}, {' '.join(':'.join(f) for f in self.fields)!r})"
