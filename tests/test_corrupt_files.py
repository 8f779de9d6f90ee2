"""Corrupt or inconsistent checkpoints fail fast with a FormatError that names the
file, the tensor or key, and the problem; nothing absurd is allocated."""
from __future__ import annotations

import json
import shutil
import struct
import time
import tracemalloc

import pytest

from bitlora.formats import FormatError, open_checkpoint
from bitlora.formats.source import BytesSource
from fixtures.make_tiny import ODD, TINY, make_gguf, make_hf


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("corrupt")
    hf = make_hf(root / "hf", "offline_bitlinear", dims=ODD)
    dims = dict(TINY, num_hidden_layers=1, vocab_size=300)
    gg = make_gguf(make_hf(root / "src", "online_f32", dims=dims), root / "m.gguf", "tq2_0")
    return {"root": root, "hf": hf, "gguf": gg.read_bytes()}


def check(make, *words, name="bad.gguf", load=None):
    """open (and optionally load) within 1 s and < 32 MB of Python allocations,
    expecting FormatError whose message holds every word."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(FormatError) as ei:
            src = make()
            ck = open_checkpoint(src)
            if load:
                ck.load(load)
        dt = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(ei.value)
    assert dt < 1.0, f"took {dt:.2f} s: {msg}"
    assert peak < 32 << 20, f"allocated {peak} bytes: {msg}"
    for w in words + (name,):
        assert w in msg, f"{w!r} not in {msg!r}"
    print("\n  ", msg)
    return msg


# -- GGUF ----------------------------------------------------------------------------

def layout(data: bytes):
    """Offsets of header fields, found with the gguf package's reader."""
    import tempfile
    from gguf import GGUFReader
    with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
        f.write(data)
        f.flush()
        r = GGUFReader(f.name)
        out = {"fields": {k: f.offset for k, f in r.fields.items()},
               "tensor": r.tensors[0].field.offset, "tensor_name": r.tensors[0].name,
               "data": r.data_offset}
    return out


def patched(data: bytes, off: int, fmt: str, value) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, off, value)
    return bytes(b)


def src(data, name="bad.gguf"):
    return lambda: BytesSource(data, name)


def test_gguf_ok(files):
    ck = open_checkpoint(BytesSource(files["gguf"], "ok.gguf"))
    for n in ck.tensor_names():
        ck.load(n)


def test_bad_magic(files):
    check(src(b"GGUX" + files["gguf"][4:]), "bad magic")
    check(src(b"\0" * 3), "too short")


def test_bad_version(files):
    check(src(patched(files["gguf"], 4, "<I", 7)), "version 7")


@pytest.mark.parametrize("where", [30, 200, "infos", "data", -1])
def test_truncated(files, where):
    d = files["gguf"]
    lay = layout(d)
    cut = {"infos": lay["tensor"] + 5, "data": lay["data"] + 10, -1: len(d) - 1}.get(where, where)
    check(src(d[:cut]), "truncated")


def test_absurd_counts(files):
    d = files["gguf"]
    check(src(patched(d, 8, "<Q", 1 << 60)), "tensor count")
    check(src(patched(d, 16, "<Q", 1 << 60)), "metadata count")
    check(src(patched(d, 24, "<Q", 1 << 62)), "string length")
    lay = layout(d)
    off = lay["fields"]["tokenizer.ggml.tokens"]
    keylen = struct.unpack_from("<Q", d, off)[0]
    count_at = off + 8 + keylen + 4 + 4                  # key, value type, element type
    check(src(patched(d, count_at, "<Q", 1 << 60)), "tokenizer.ggml.tokens", "array of")


def _tensor_fields(d, lay):
    off = lay["tensor"]
    nlen = struct.unpack_from("<Q", d, off)[0]
    nd_at = off + 8 + nlen
    nd = struct.unpack_from("<I", d, nd_at)[0]
    return nd_at, nd_at + 4, nd_at + 4 + 8 * nd, nd_at + 4 + 8 * nd + 4   # n_dims, ne, type, offset


def test_unknown_type_and_absurd_sizes(files):
    d = files["gguf"]
    lay = layout(d)
    name = lay["tensor_name"]
    nd_at, ne_at, type_at, off_at = _tensor_fields(d, lay)
    check(src(patched(d, type_at, "<I", 99)), name, "unknown GGML type 99")
    check(src(patched(d, ne_at, "<Q", 1 << 50)), name, "absurd dimension")
    check(src(patched(d, ne_at, "<Q", 1 << 39)), name, "do not fit")
    check(src(patched(d, off_at, "<Q", 1 << 62)), name, "do not fit")
    check(src(patched(d, nd_at, "<I", 9)), name, "9 dimensions")


def test_unsupported_type_named(files):
    d = files["gguf"]
    lay = layout(d)
    name = lay["tensor_name"]
    _, _, type_at, _ = _tensor_fields(d, lay)
    check(src(patched(d, type_at, "<I", 8)), name)          # Q8_0: sized, then refused or misfit


def test_shape_contradicts_config(files):
    d = files["gguf"]
    lay = layout(d)
    off = lay["fields"]["bitnet-b1.58.feed_forward_length"]
    keylen = struct.unpack_from("<Q", d, off)[0]
    check(src(patched(d, off + 8 + keylen + 4, "<I", 384)), "the config says")


def test_code3_in_ternary_data(files):
    d = bytearray(files["gguf"])
    ck = open_checkpoint(BytesSource(bytes(d), "x.gguf"))
    name = "model.layers.0.self_attn.q_proj.weight"
    gname, _, off, _ = ck._where[name]
    d[off] = 0xFF                                        # TQ2_0 qs byte: four codes 3
    check(src(bytes(d)), gname, "code 3", load=name)


# -- HF folder -------------------------------------------------------------------------

def copy_hf(files, tmp_path):
    dst = tmp_path / "hf"
    shutil.copytree(files["hf"], dst)
    return dst


def rewrite_safetensors(path, edit):
    raw = path.read_bytes()
    n = struct.unpack_from("<Q", raw)[0]
    header = json.loads(raw[8:8 + n])
    edit(header)
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + raw[8 + n:])


def test_hf_ok(files):
    ck = open_checkpoint(files["hf"])
    for n in ck.tensor_names():
        ck.load(n)


def test_hf_safetensors_header(files, tmp_path):
    d = copy_hf(files, tmp_path)
    st = d / "model.safetensors"
    raw = st.read_bytes()
    st.write_bytes(struct.pack("<Q", 1 << 60) + raw[8:])
    check(lambda: d, "header length", name="model.safetensors")
    st.write_bytes(raw[:8] + b"#" + raw[9:])
    check(lambda: d, "not valid JSON", name="model.safetensors")
    st.write_bytes(raw[:len(raw) - 100])
    check(lambda: d, "outside", name="model.safetensors")


def test_hf_tensor_entries(files, tmp_path):
    d = copy_hf(files, tmp_path)
    st = d / "model.safetensors"
    raw = st.read_bytes()
    n = "model.norm.weight"

    def shape(h):
        h[n]["shape"] = [h[n]["shape"][0] * 2]
    rewrite_safetensors(st, shape)
    check(lambda: d, n, "expected", name="model.safetensors")
    st.write_bytes(raw)

    def dtype(h):
        h[n]["dtype"] = "Q9"
    rewrite_safetensors(st, dtype)
    check(lambda: d, n, "unknown dtype", name="model.safetensors")
    st.write_bytes(raw)

    def offsets(h):
        h[n]["data_offsets"] = [0, 1 << 61]
    rewrite_safetensors(st, offsets)
    check(lambda: d, n, "outside", name="model.safetensors")


def test_hf_config_contradicts_shapes(files, tmp_path):
    d = copy_hf(files, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 76
    (d / "config.json").write_text(json.dumps(cfg))
    check(lambda: d, "the config says", name="model.safetensors")
    cfg["intermediate_size"] = 10 ** 13
    (d / "config.json").write_text(json.dumps(cfg))
    check(lambda: d, "intermediate_size", "sane", name="config.json")
    (d / "config.json").write_text("{nope")
    check(lambda: d, "invalid JSON", name="config.json")


def test_hf_missing_and_code3(files, tmp_path):
    d = copy_hf(files, tmp_path)
    st = d / "model.safetensors"
    raw = bytearray(st.read_bytes())
    ck = open_checkpoint(d)
    name = "model.layers.0.mlp.up_proj.weight"
    raw[ck._entries[name].offset] = 0xFF
    ck.close()
    st.write_bytes(bytes(raw))
    check(lambda: d, name, "code 3", name="model.safetensors", load=name)
    st.unlink()
    check(lambda: d, "model.safetensors missing", name="hf")
