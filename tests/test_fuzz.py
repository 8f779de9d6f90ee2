"""Fuzzing the file parsers with hypothesis: GGUF, safetensors (checkpoint and
adapter readers), Hugging Face folders, tokenizer.json and Alpaca datasets.

Each target gets nearly-valid files (a tiny valid file built here, then fields and
bytes mutated: integer fields set to edge values, JSON nodes replaced or deleted,
bytes flipped, inserted, cut) and pure random bytes. Every input must end in
either a parsed object (every tensor loaded, the tokenizer encoding a sentence, the
dataset tokenized) or the parser's documented exception with a message:

    GGUF / safetensors / HF folder   bitlora.formats.FormatError
    GGUF tokenizer metadata          TokenizerError (malformed) or NotImplementedError (unsupported)
    adapter safetensors (loads)      ValueError
    tokenizer.json                   TokenizerError or NotImplementedError
    Alpaca JSON / JSONL              bitlora.data.DataError

Anything else escaping is a bug. Each input must also finish within 2 s and its
peak traced allocation (tracemalloc) stay under MEM_FACTOR * input size + MEM_CONST.

Size: FUZZ_EXAMPLES examples per target (default 10 000, the CI setting; set
BITLORA_FUZZ_EXAMPLES=300 for a quick local loop). derandomize=True: the same
inputs every run, so a failure reproduces. docs/RELIABILITY.md has the times.
Native-only (hypothesis).
"""
from __future__ import annotations

import json
import os
import struct
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from bitlora.formats import safetensors as safetensors_io
from bitlora.data import DataError, Dataset, load_records
from bitlora.formats import FormatError
from bitlora.formats import open_checkpoint
from bitlora.formats.safetensors import parse_safetensors
from bitlora.formats.source import BytesSource
from bitlora.tokenizer import Tokenizer, TokenizerError

FUZZ_EXAMPLES = int(os.environ.get("BITLORA_FUZZ_EXAMPLES", "10000"))
TIME_LIMIT_S = 2.0
MEM_FACTOR, MEM_CONST = 32, 2 << 20
FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck), print_blob=True)


def outcome(parse, data, allowed, size=None):
    """Run parse(data); 'ok' or the allowed exception's name; checks time and memory."""
    size = len(data) if size is None else size
    tracemalloc.start()                # only around the parse: hypothesis runs untraced
    t0 = time.process_time()           # CPU time: other jobs on a shared machine don't count
    try:
        parse(data)
        result = "ok"
    except allowed as e:
        assert str(e), f"{type(e).__name__} without a message"
        result = type(e).__name__
    except BaseException:
        if currently_in_test_context():
            text = repr(data)
            note(f"input: {text[:3000]}{' ...' if len(text) > 3000 else ''}")
        raise
    finally:
        dt = time.process_time() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    if dt >= TIME_LIMIT_S:             # tracing slows allocation-heavy code (regex compiles) a few times
        t0 = time.process_time()
        try:
            parse(data)
        except allowed:
            pass
        dt = time.process_time() - t0
    assert dt < TIME_LIMIT_S, f"took {dt:.2f} s on a {size}-byte input"
    assert peak <= MEM_FACTOR * size + MEM_CONST, f"peak {peak} bytes for a {size}-byte input"
    if currently_in_test_context():
        event(result)                  # --hypothesis-show-statistics lists the outcomes
    return result


# -- a tiny BitNet, as GGUF and as a HF folder -------------------------------------------

V, C, F, H, HKV, D = 8, 8, 16, 2, 1, 4
TOKENS = ["a", "b", "c", "ab", "<s>", "</s>", "\u0120", "d"]
CONFIG = dict(vocab_size=V, hidden_size=C, intermediate_size=F, num_hidden_layers=1,
              num_attention_heads=H, num_key_value_heads=HKV, max_position_embeddings=64,
              tie_word_embeddings=True, bos_token_id=4, eos_token_id=5)
# HF name, GGUF name, shape [rows, cols]
TENSORS = [("model.embed_tokens.weight", "token_embd.weight", (V, C)),
           ("model.norm.weight", "output_norm.weight", (C,))] + [
    (f"model.layers.0.{hf}.weight", f"blk.0.{g}.weight", shape) for hf, g, shape in [
        ("input_layernorm", "attn_norm", (C,)), ("self_attn.q_proj", "attn_q", (H * D, C)),
        ("self_attn.k_proj", "attn_k", (HKV * D, C)), ("self_attn.v_proj", "attn_v", (HKV * D, C)),
        ("self_attn.o_proj", "attn_output", (C, H * D)), ("self_attn.attn_sub_norm", "attn_sub_norm", (C,)),
        ("post_attention_layernorm", "ffn_norm", (C,)), ("mlp.gate_proj", "ffn_gate", (F, C)),
        ("mlp.up_proj", "ffn_up", (F, C)), ("mlp.down_proj", "ffn_down", (C, F)),
        ("mlp.ffn_sub_norm", "ffn_sub_norm", (F,))]]
GGUF_TYPE = {"ffn_gate": 36, "attn_output": 0, "attn_k": 0, "attn_v": 1, "attn_q": 1, "ffn_up": 30,
             "ffn_down": 30}      # I2_S (128 weights), F32, F16, BF16; norms and embedding F32


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def ternary_f32(n, k=0):
    return struct.pack(f"<{n}f", *[(i * 7 + k) % 3 - 1.0 for i in range(n)])


def tensor_bytes(ttype, n, k):
    if ttype == 36:                                   # I2_S: 2-bit codes 0..2, then the f32 scale
        return bytes((0x24 + 17 * i) & 0b10_10_10_10 for i in range(n // 4)) + struct.pack("<f", 0.5) + bytes(28)
    vals = ternary_f32(n, k)
    if ttype == 1:
        return struct.pack(f"<{n}e", *struct.unpack(f"<{n}f", vals))
    if ttype == 30:
        return b"".join(vals[i + 2:i + 4] for i in range(0, len(vals), 4))
    return vals


class Writer:
    """Little-endian writer that remembers where its integer fields are."""

    def __init__(self):
        self.buf, self.fields = bytearray(), []

    def int(self, fmt, v):
        self.fields.append((len(self.buf), fmt))
        self.buf += struct.pack("<" + fmt, v)

    def str(self, s):
        b = s.encode("utf-8", "surrogatepass")   # generated strings may hold lone surrogates: bad UTF-8 is an input too
        self.int("Q", len(b))
        self.buf += b


def gguf_value(w, vtype, v):
    if vtype == 8:
        w.str(v)
    elif vtype == 9:
        etype, items = v
        w.int("I", etype)
        w.int("Q", len(items))
        for x in items:
            gguf_value(w, etype, x)
    else:
        w.int({0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}[vtype], v)


def gguf_metadata():
    a = "bitnet-b1.58"
    return [("general.architecture", 8, a), ("general.alignment", 4, 32),
            (f"{a}.vocab_size", 4, V), (f"{a}.embedding_length", 4, C), (f"{a}.feed_forward_length", 4, F),
            (f"{a}.block_count", 4, 1), (f"{a}.attention.head_count", 4, H),
            (f"{a}.attention.head_count_kv", 4, HKV), (f"{a}.context_length", 4, 64),
            (f"{a}.attention.layer_norm_rms_epsilon", 6, 1e-5), (f"{a}.rope.freq_base", 6, 10000.0),
            ("tokenizer.ggml.model", 8, "gpt2"), ("tokenizer.ggml.pre", 8, "gpt-2"),
            ("tokenizer.ggml.tokens", 9, (8, TOKENS)), ("tokenizer.ggml.token_type", 9, (5, [1, 1, 1, 1, 3, 3, 1, 1])),
            ("tokenizer.ggml.merges", 9, (8, ["a b"])), ("tokenizer.ggml.bos_token_id", 4, 4),
            ("tokenizer.ggml.eos_token_id", 4, 5)]


def gguf_tensors():
    out = []
    for k, (_, gname, shape) in enumerate(TENSORS):
        ttype = GGUF_TYPE.get(gname.split(".")[-2] if gname.startswith("blk") else "", 0)
        out.append((gname, list(reversed(shape)), ttype, tensor_bytes(ttype, numel(shape), k)))
    return out


def write_gguf(metadata, tensors, align=32):
    """(file bytes, [(offset, struct fmt)] of every integer field)."""
    w = Writer()
    w.buf += b"GGUF"
    w.int("I", 3)
    w.int("Q", len(tensors))
    w.int("Q", len(metadata))
    for key, vtype, v in metadata:
        w.str(key)
        w.int("I", vtype)
        gguf_value(w, vtype, v)
    off, blobs = 0, []
    for name, ne, ttype, data in tensors:
        w.str(name)
        w.int("I", len(ne))
        for d in ne:
            w.int("Q", d)
        w.int("I", ttype)
        w.int("Q", off)
        blobs.append(data + bytes(-len(data) % align))
        off += len(blobs[-1])
    w.buf += bytes(-len(w.buf) % align)
    return bytes(w.buf + b"".join(blobs)), w.fields


def safetensors_header(tensors):
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    return header, b"".join(raw for *_, raw in tensors)


def write_safetensors(header, data):
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + data


HF_HEADER, HF_DATA = safetensors_header(
    [(name, "F32", shape, ternary_f32(numel(shape), k)) for k, (name, _, shape) in enumerate(TENSORS)])
GGUF_MD, GGUF_TS = gguf_metadata(), gguf_tensors()
GGUF_SEED, GGUF_FIELDS = write_gguf(GGUF_MD, GGUF_TS)
ADAPTER_HEADER, ADAPTER_DATA = safetensors_header(
    [("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", "F32", (2, C), ternary_f32(2 * C)),
     ("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", "F16", (H * D, 2), bytes(2 * H * D * 2)),
     ("x", "BF16", (3,), b"\x80\x3f" * 3)])

TOKENIZER = {
    "version": "1.0",
    "added_tokens": [{"id": 4, "content": "<s>", "special": True, "normalized": False, "lstrip": False,
                      "rstrip": False, "single_word": False},
                     {"id": 5, "content": "</s>", "special": True}],
    "normalizer": None,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r" ?\p{L}+| ?\p{N}+|\s+(?!\S)|\s+"}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
    "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                               {"Sequence": {"id": "A", "type_id": 0}}],
                       "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [4], "tokens": ["<s>"]}}},
    "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
              "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
              "vocab": {t: i for i, t in enumerate(TOKENS) if i not in (4, 5)},
              "merges": [["a", "b"], "\u0120 a"]},
}

ALPACA = [{"instruction": "Say hi.", "input": "", "output": "hi"},
          {"instruction": "Add.", "input": "1 + 2", "output": "3"},
          {"instruction": "<img src=x onerror=alert(1)>", "output": "text\u2028\U0001F600"}]


class ByteTok:
    """Stand-in tokenizer for the dataset target: one id per UTF-8 byte."""
    bos_id, eos_id, pad_id = 256, 257, None

    def encode(self, text, add_special_tokens=False):
        return list(text.encode("utf-8", "surrogatepass"))


# -- mutations ---------------------------------------------------------------------------
# Hypothesis draws one seeded `random.Random` per example (cheap to generate, and
# derandomized); the mutators below use it. On a failure the input is printed.

EDGE = [0, 1, 2, 3, 7, 8, 31, 32, 33, 127, 128, 255, 256, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000,
        0xFFFFFFFF, 1 << 32, 1 << 40, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]
BYTE_EDITS = ["field", "field", "flip", "set", "insert", "delete", "cut"]


def mutate_bytes(rnd, data: bytes, fields=(), max_edits=4) -> bytes:
    """Up to max_edits edits: an integer field set to an edge value, a byte flipped or
    set, random bytes inserted, a range deleted, the tail cut."""
    b = bytearray(data)
    for _ in range(rnd.randint(0, max_edits)):
        kind = rnd.choice(BYTE_EDITS)
        pos = rnd.randrange(len(b)) if b else 0
        if kind == "field" and fields:
            off, fmt = rnd.choice(fields)
            size = struct.calcsize(fmt)
            v = (rnd.choice(EDGE) if rnd.random() < 0.7 else rnd.randrange(300)) % (1 << 8 * size)
            if off + size <= len(b):
                b[off:off + size] = v.to_bytes(size, "little")
        elif kind == "flip" and b:
            b[pos] ^= 1 << rnd.randrange(8)
        elif kind == "set" and b:
            b[pos] = rnd.choice([0, 1, 0x7F, 0x80, 0xFF, ord("{"), ord('"'), ord("["), ord("\\")])
        elif kind == "insert":
            b[pos:pos] = rnd.randbytes(rnd.randint(1, 16))
        elif kind == "delete":
            del b[pos:pos + rnd.randint(1, 16)]
        elif kind == "cut":
            del b[pos:]
    return bytes(b)


def random_text(rnd, n=8) -> str:
    pick = [lambda: rnd.randrange(32, 127), lambda: rnd.randrange(0x3000), lambda: rnd.randrange(0x110000)]
    return "".join(chr(rnd.choice(pick)()) for _ in range(rnd.randint(0, n)))


def random_json(rnd, depth=0):
    r = rnd.random()
    if depth < 2 and r < 0.12:
        return [random_json(rnd, depth + 1) for _ in range(rnd.randint(0, 3))]
    if depth < 2 and r < 0.24:
        return {random_text(rnd, 5): random_json(rnd, depth + 1) for _ in range(rnd.randint(0, 3))}
    return rnd.choice([None, True, False, rnd.choice(EDGE), -rnd.choice(EDGE), 10 ** 30, rnd.randint(-5, 300),
                       rnd.uniform(-1e6, 1e6), 1e308, -0.0, random_text(rnd)])


def _paths(node, path=()):
    yield path
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, path + (i,))


def mutate_json(rnd, tree, max_edits=3):
    """Up to max_edits edits of a JSON tree: a node replaced by a random value, or deleted."""
    tree = json.loads(json.dumps(tree))
    for _ in range(rnd.randint(0, max_edits)):
        paths = [p for p in _paths(tree) if p]
        if not paths:
            break
        path = rnd.choice(paths)
        parent = tree
        for k in path[:-1]:
            parent = parent[k]
        if rnd.random() < 0.3 and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = random_json(rnd)
    return tree


def json_text(tree):
    return json.dumps(tree, ensure_ascii=False).encode("utf-8", "surrogatepass")


def random_bytes(rnd):
    """Pure noise, sometimes behind a plausible prefix (GGUF magic, a small u64, '[' or '{')."""
    noise = rnd.randbytes(rnd.randint(0, 4096))
    return rnd.choice([b"", b"", b"GGUF\x03\0\0\0", struct.pack("<Q", rnd.randint(0, 64)), b"[", b"{"]) + noise


def mutated_json(rnd, tree):
    if rnd.random() < 0.15:
        return random_bytes(rnd)
    text = json_text(mutate_json(rnd, tree))
    return mutate_bytes(rnd, text, max_edits=2) if rnd.random() < 0.5 else text


SEEDED = st.randoms(use_true_random=False)


# -- targets --------------------------------------------------------------------------------

def load_gguf(data):
    ck = open_checkpoint(BytesSource(data, "fuzz.gguf"))
    for name in ck.tensor_names():
        ck.load(name)
    tok = Tokenizer.from_gguf_metadata(ck.gguf_metadata)
    tok.decode(tok.encode("ab c", add_special_tokens=True))


def gguf_input(rnd):
    if rnd.random() < 0.15:
        return random_bytes(rnd)
    md, ts = list(GGUF_MD), list(GGUF_TS)
    if rnd.random() < 0.3:                   # one metadata value replaced, any type
        i = rnd.randrange(len(md))
        md[i] = (md[i][0], *rnd.choice([(4, rnd.choice(EDGE[:18])), (8, random_text(rnd)), (6, rnd.uniform(-1, 1e6)),
                                       (7, True), (9, (8, [random_text(rnd, 3) for _ in range(rnd.randint(0, 4))])),
                                       (9, (4, [rnd.randrange(10) for _ in range(rnd.randint(0, 4))]))]))
    if rnd.random() < 0.3:                   # one tensor's shape or type changed
        i = rnd.randrange(len(ts))
        name, ne, ttype, data = ts[i]
        if rnd.random() < 0.5:
            ne = [rnd.choice([0, 1, 4, 8, 16, 32, 128, 1 << 33]) for _ in range(rnd.randint(1, 4))]
        else:
            ttype = rnd.choice([0, 1, 2, 8, 30, 34, 35, 36, 37, 1 << 31])
        ts[i] = (name, ne, ttype, data)
    return mutate_bytes(rnd, *write_gguf(md, ts))


@pytest.fixture(scope="module", autouse=True)
def warm():
    """One-time costs (compiling the split regexes) are not a parser's time per input."""
    load_gguf(GGUF_SEED)
    load_tokenizer(json_text(TOKENIZER))


@FUZZ
@given(SEEDED)
def test_fuzz_gguf(rnd):
    data = gguf_input(rnd)
    outcome(load_gguf, data, (FormatError, TokenizerError, NotImplementedError))


HF_FILES = {"config.json": json.dumps(CONFIG).encode(), "model.safetensors": write_safetensors(HF_HEADER, HF_DATA)}


def load_hf(files):
    ck = open_checkpoint(dict(files))
    for name in ck.tensor_names():
        ck.load(name)


def hf_input(rnd):
    files = dict(HF_FILES)
    what = rnd.choice(["config", "header", "header", "bytes", "random"])
    if what == "config":
        files["config.json"] = mutated_json(rnd, CONFIG)
    elif what == "header":
        files["model.safetensors"] = write_safetensors(mutate_json(rnd, HF_HEADER), HF_DATA)
    elif what == "bytes":
        files["model.safetensors"] = mutate_bytes(rnd, files["model.safetensors"], [(0, "Q")])
    else:
        files["model.safetensors"] = random_bytes(rnd)
    return files


@FUZZ
@given(SEEDED)
def test_fuzz_safetensors_checkpoint(rnd):
    """The checkpoint reader: parse_safetensors on the file, then the whole HF folder."""
    files = hf_input(rnd)
    st_bytes = files["model.safetensors"]

    def load(_):
        try:
            parse_safetensors(BytesSource(st_bytes, "model.safetensors"))
        finally:
            load_hf(files)
    outcome(load, files, (FormatError,), size=sum(len(v) for v in files.values()))


def adapter_input(rnd):
    if rnd.random() < 0.15:
        return random_bytes(rnd)
    return mutate_bytes(rnd, write_safetensors(mutate_json(rnd, ADAPTER_HEADER), ADAPTER_DATA), [(0, "Q")], 2)


@FUZZ
@given(SEEDED)
def test_fuzz_adapter_safetensors(rnd):
    outcome(lambda d: safetensors_io.loads(d, "adapter.safetensors"), adapter_input(rnd), (ValueError,))


def load_tokenizer(data):
    tok = Tokenizer.from_json(data.decode("utf-8", "replace"))
    try:
        tok.decode(tok.encode("ab c 12 <s>ab</s>", add_special_tokens=True))
    except (TokenizerError, NotImplementedError):
        raise
    except Exception as e:         # parsed, but unusable: must have been refused at load time
        raise AssertionError(f"loaded tokenizer fails to encode: {type(e).__name__}: {e}") from e


@FUZZ
@given(SEEDED)
def test_fuzz_tokenizer_json(rnd):
    outcome(load_tokenizer, mutated_json(rnd, TOKENIZER), (TokenizerError, NotImplementedError))


def load_alpaca(data, name):
    Dataset(load_records(data, name), ByteTok(), cutoff_len=512)


def alpaca_input(rnd):
    if rnd.random() < 0.5:
        return mutated_json(rnd, ALPACA), "data.json"
    text = "\n".join(json.dumps(r, ensure_ascii=False) for r in mutate_json(rnd, ALPACA)
                     ).encode("utf-8", "surrogatepass")
    return mutate_bytes(rnd, text, max_edits=2), "data.jsonl"


@FUZZ
@given(SEEDED)
def test_fuzz_alpaca(rnd):
    data, name = alpaca_input(rnd)
    outcome(lambda d: load_alpaca(d, name), data, (DataError,))


# -- the seeds are valid, and regressions the fuzzer found ------------------------------------

def test_seeds_parse():
    load_gguf(GGUF_SEED)
    load_hf(HF_FILES)
    tensors, meta = safetensors_io.loads(write_safetensors(ADAPTER_HEADER, ADAPTER_DATA))
    assert list(tensors["x"][1]) == [1.0, 1.0, 1.0] and meta == {"format": "pt"}
    load_tokenizer(json_text(TOKENIZER))
    load_alpaca(json_text(ALPACA), "data.json")


def refused(parse, data, exc, *words):
    """parse(data) raises exc, quickly and with little memory, naming each of words."""
    with pytest.raises(exc) as info:
        outcome(parse, data, ())
    for w in words:
        assert w in str(info.value), str(info.value)


def test_regressions_json_nesting():
    """json.loads raises RecursionError (not ValueError) on deep nesting."""
    deep = b"[" * 100_000
    refused(lambda d: load_records(d, "data.json"), deep, DataError, "not JSON")
    refused(lambda d: load_records(b"\n" + d + b"\n{}", "data.jsonl") and load_alpaca(b"\n" + d, "data.jsonl"),
            deep, DataError)
    refused(lambda d: parse_safetensors(BytesSource(struct.pack("<Q", len(d)) + d)), deep, FormatError, "JSON")
    refused(lambda d: safetensors_io.loads(struct.pack("<Q", len(d)) + d), deep, ValueError, "header")
    refused(Tokenizer.from_json, deep.decode(), TokenizerError)


def _with_entry(header, name, **change):
    h = json.loads(json.dumps(header))
    h[name].update(change)
    return h


def test_regressions_safetensors_entries():
    name = "model.norm.weight"
    refused(lambda d: parse_safetensors(BytesSource(d)),
            write_safetensors(_with_entry(HF_HEADER, name, dtype=[]), HF_DATA), FormatError, "dtype")
    x = "x"
    for change, word in [(dict(dtype=[]), "dtype"), (dict(shape=[1]), "bytes"), (dict(data_offsets=[4, 2]), "offsets"),
                         (dict(data_offsets=[-2, 4]), "offsets"), (dict(shape=[-3]), "shape"),
                         (dict(dtype="F16", shape=[3], data_offsets=[0, 5]), "bytes")]:
        refused(safetensors_io.loads, write_safetensors(_with_entry(ADAPTER_HEADER, x, **change), ADAPTER_DATA),
                ValueError, word)
    refused(safetensors_io.loads, write_safetensors([], b""), ValueError, "not a JSON object")
    refused(safetensors_io.loads, write_safetensors({"__metadata__": 3}, b""), ValueError, "__metadata__")


def test_regressions_tokenizer_ids():
    """A huge id once allocated a list that long; bad ids reached encode."""
    def tok(**model):
        return json.dumps({**TOKENIZER, "model": {**TOKENIZER["model"], **model}})
    refused(Tokenizer.from_json, tok(vocab={"a": 10 ** 12}), TokenizerError, "token id")
    refused(Tokenizer.from_json, tok(vocab={"a": -1}), TokenizerError, "token id")
    refused(Tokenizer.from_json, tok(vocab={"a": "0"}), TokenizerError, "token id")
    refused(Tokenizer.from_json, "{}", TokenizerError, "model")
    refused(Tokenizer.from_json, "[]", TokenizerError)
    bad_template = json.loads(json.dumps(TOKENIZER))
    bad_template["post_processor"]["special_tokens"]["<s>"]["ids"] = [[]]
    refused(Tokenizer.from_json, json.dumps(bad_template), TokenizerError, "template")
    bad_template["post_processor"]["special_tokens"]["<s>"]["ids"] = [None]
    refused(Tokenizer.from_json, json.dumps(bad_template), TokenizerError, "template")
    split = json.loads(json.dumps(TOKENIZER))
    split["pre_tokenizer"]["pretokenizers"][0]["behavior"] = ["Isolated"]
    refused(Tokenizer.from_json, json.dumps(split), TokenizerError, "behavior")   # failed in encode
    split["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways"
    refused(Tokenizer.from_json, json.dumps(split), NotImplementedError, "behavior")
    with pytest.raises(TokenizerError, match="not in the vocab"):      # merge into an unknown token
        Tokenizer.from_json(tok(vocab={"a": 0, "b": 1})).encode("ab")
    refused(Tokenizer.from_gguf_metadata, {"tokenizer.ggml.tokens": 5}, TokenizerError)


def test_regressions_checkpoint_config():
    """A corrupt layer count built a table of 11 names per layer before any check;
    non-numeric eps / theta and non-object JSON parts escaped as other exceptions."""
    md = [m if m[0] != "bitnet-b1.58.block_count" else (m[0], 4, 1 << 24) for m in GGUF_MD]
    refused(lambda d: open_checkpoint(BytesSource(d)), write_gguf(md, GGUF_TS)[0], FormatError, "num_hidden_layers")
    for change, word in [(dict(rms_norm_eps="x"), "rms_norm_eps"), (dict(rope_theta=10 ** 400), "rope_theta"),
                         (dict(quantization_config=[1]), "quantization_config"),
                         (dict(num_hidden_layers=1 << 24), "num_hidden_layers")]:
        files = {**HF_FILES, "config.json": json.dumps({**CONFIG, **change}).encode()}
        refused(load_hf, files, FormatError, word)
    refused(load_hf, {**HF_FILES, "model.safetensors.index.json": b"[1]"}, FormatError, "weight_map")


def test_regressions_non_finite_weights():
    """Float projections holding Inf divided by zero while ternarising."""
    data = bytearray(HF_DATA)
    q = HF_HEADER["model.layers.0.self_attn.q_proj.weight"]["data_offsets"][0]
    data[q:q + 4] = struct.pack("<f", float("inf"))
    files = {**HF_FILES, "model.safetensors": write_safetensors(HF_HEADER, bytes(data))}
    refused(load_hf, files, FormatError, "Inf or NaN")
    data[q:q + 4] = struct.pack("<f", float("nan"))
    files = {**HF_FILES, "model.safetensors": write_safetensors(HF_HEADER, bytes(data))}
    refused(load_hf, files, FormatError, "Inf or NaN")
