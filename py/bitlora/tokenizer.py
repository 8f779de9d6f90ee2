"""Byte-level BPE tokenizer (LLaMA-3 / GPT-2 style), identical to HF `tokenizers`.

What it is: a pure standard-library reader of a HF `tokenizer.json` or of a GGUF
file's `tokenizer.ggml.*` metadata, with `encode` / `decode` that give the same ids
and text as HF `tokenizers` on any Unicode string. It runs unchanged natively and
in Pyodide (no `regex` package, no numpy, no JavaScript).

What it is not: a general HF tokenizer. Supported pieces: normalizer null; pre-
tokenizers Split / ByteLevel / Sequence of them; model BPE (byte-level, optional
`ignore_merges`, optional `unk_token`); decoder ByteLevel (or none); post-processors
TemplateProcessing (single sequence), ByteLevel, Sequence. Anything else raises
NotImplementedError at load time rather than tokenizing differently.

How the split stays identical to HF: HF runs the split regex with Oniguruma, whose
`\\p{L}`, `\\p{N}` and `\\s` follow its own Unicode version, which is neither the
host Python's nor the browser's. So the pattern is rewritten for the standard `re`
module with those classes spelled out as explicit code-point ranges (the tables at
the bottom, taken from what HF `tokenizers` 0.23 matches; a test checks them
against HF over every code point), and `(?i:'s|...)` is expanded into plain
character classes with Oniguruma's case folding ('s also matches U+017F).

Encoding, step by step (as HF does it):
  1. split off added tokens (`<|begin_of_text|>` ...): leftmost-longest match,
     honouring lstrip / rstrip / single_word; first the added tokens that are not
     normalized, then the normalized ones;
  2. pre-tokenize each remaining piece: regex split, then the GPT-2 byte-to-unicode
     mapping of its UTF-8 bytes;
  3. BPE each pre-token: whole pre-token if `ignore_merges` and it is in the vocab;
     else start from characters and repeatedly apply the lowest-ranked merge,
     leftmost first (one occurrence at a time, HF's order); results are cached;
  4. with add_special_tokens, the post-processor's template adds BOS / EOS.
"""
from __future__ import annotations

import bisect
import heapq
import json
import re
import unicodedata

__all__ = ["Tokenizer", "TokenizerError", "LLAMA3_SPLIT", "GPT2_SPLIT"]


class TokenizerError(ValueError):
    """tokenizer.json or GGUF tokenizer metadata is malformed (wrong types, missing
    keys, ids out of range). Unsupported but well-formed pieces raise NotImplementedError."""


# Ids may leave gaps, but not absurd ones: the id -> token table is a list.
MAX_ID_GAP = 1 << 16
_MALFORMED = (KeyError, TypeError, AttributeError, IndexError, ValueError, RecursionError, re.error)

# The two split patterns in the wild for byte-level BPE (HF / Oniguruma syntax).
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

# GGUF `tokenizer.ggml.token_type` values.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table: byte b is shown as chr(b) when
    printable, else as chr(256 + k) for the k-th unprintable byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, k = [""] * 256, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + k)
            k += 1
    return table


BYTE_CHARS = bytes_to_unicode()
CHAR_BYTES = {c: b for b, c in enumerate(BYTE_CHARS)}
_LATIN1_TO_BYTE_CHARS = {b: c for b, c in enumerate(BYTE_CHARS)}  # for str.translate

# Unicode White_Space: what Oniguruma's \s matches (checked by a test), and what
# lstrip / rstrip of added tokens strip (Rust's char::is_whitespace).
_TABLE_WS = "9-d 20 85 a0 1680 2000-200a 2028-2029 202f 205f 3000"
_WS_SET = frozenset(chr(c) for tok in _TABLE_WS.split()
                    for a, _, b in [tok.partition("-")] for c in range(int(a, 16), int(b or a, 16) + 1))


# ---------------------------------------------------------------------------
# Split-pattern translation: HF / Oniguruma syntax -> Python `re` with explicit
# Unicode classes, so that the host's Unicode version plays no part.

_FOLD_EXTRA = {"s": "\u017f", "k": "\u212a"}  # Oniguruma case-folds these too


def _class_body(table: str) -> str:
    """'41-5a 61-7a aa' (hex code points and ranges) -> the inside of a re class."""
    def esc(cp):
        return f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}"
    out = []
    for tok in table.split():
        a, _, b = tok.partition("-")
        out.append(esc(int(a, 16)) + ("-" + esc(int(b, 16)) if b else ""))
    return "".join(out)


def _bmp(table: str) -> str:
    return " ".join(t for t in table.split() if int(t.partition("-")[0], 16) < 0x10000)


def translate_pattern(pattern: str, bmp_only: bool = False) -> str:
    r"""Rewrite a split regex for Python `re`: \p{L}, \p{N}, \s, \S become explicit
    classes and (?i:...) of literal text becomes case classes. Constructs whose
    meaning depends on a Unicode table we do not carry raise NotImplementedError.
    bmp_only: the classes list only code points below U+10000 (see _Splitter)."""
    cut = _bmp if bmp_only else str
    cls = {"L": _class_body(cut(_TABLE_L)), "N": _class_body(cut(_TABLE_N)), "s": _class_body(_TABLE_WS)}
    out, i, n, in_class = [], 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\":
            nxt = pattern[i + 1]
            if nxt in "pP":
                end = pattern.index("}", i)
                name = {"L": "L", "Letter": "L", "N": "N", "Number": "N"}.get(pattern[i + 3:end])
                if name is None or (nxt == "P" and in_class):
                    raise NotImplementedError(f"split regex: {pattern[i:end + 1]} is not supported")
                body = cls[name]
                out.append(body if in_class else f"[{'^' if nxt == 'P' else ''}{body}]")
                i = end + 1
                continue
            if nxt in "sS":
                if nxt == "S" and in_class:
                    raise NotImplementedError(r"split regex: \S inside a class is not supported")
                out.append(cls["s"] if in_class else f"[{'^' if nxt == 'S' else ''}{cls['s']}]")
                i += 2
                continue
            if nxt in "dDwWbBhHRXk":
                raise NotImplementedError(f"split regex: \\{nxt} is not supported")
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
            out.append(c)
        elif c == "[":
            in_class = True
            out.append(c)
        elif pattern.startswith("(?i:", i):
            end = pattern.index(")", i)
            inner = pattern[i + 4:end]
            if any(ch in inner for ch in "\\[](){}.*+?^$"):
                raise NotImplementedError(f"split regex: (?i:{inner}) is not literal text")
            out.append("(?:")
            for ch in inner:
                if ch == "|" or ch.lower() == ch.upper():
                    out.append(re.escape(ch) if ch != "|" else ch)
                else:
                    variants = dict.fromkeys(ch.lower() + ch.upper() + _FOLD_EXTRA.get(ch.lower(), ""))
                    out.append("[" + "".join(variants) + "]")
            out.append(")")
            i = end + 1
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


# Stand-ins for characters above U+FFFF: a letter, a number, neither (see _Splitter).
_STAND_INS = ("\u00aa", "\u00b2", "\u00b6")


def _starts_ends(table: str) -> tuple[list[int], list[int]]:
    spans = [tok.partition("-") for tok in table.split()]
    return [int(a, 16) for a, _, _ in spans], [int(b or a, 16) for a, _, b in spans]


class _Splitter:
    """A translated split regex, fast: Python's `re` tests a character class quickly
    for characters below U+10000 (a bitmap) but walks a list for the ranges above.
    So when the pattern names no character above U+FFFF itself, the regex holds only
    the BMP part of the classes, and each character above U+FFFF in the text is
    replaced, one for one, by a BMP stand-in of the same class (letter / number /
    neither; none is white space) before matching. Matches index the original text."""
    _tables = None

    def __init__(self, pattern: str, literal: bool = False):
        if literal:
            self.rx, self.stand_in = re.compile(re.escape(pattern)), False
            return
        self.stand_in = not any(c > "\uffff" or c in _STAND_INS for c in pattern) and not re.search(
            r"\\(U|x\{|N\{)", pattern)
        self.rx = re.compile(translate_pattern(pattern, bmp_only=self.stand_in))
        self._seen: dict[str, str] = {}

    def spans(self, text: str):
        if self.stand_in and not text.isascii() and max(text) > "\uffff":
            text = text.translate({ord(c): self._stand_in(c) for c in set(text) if c > "\uffff"})
        return (m.span() for m in self.rx.finditer(text))

    def _stand_in(self, c: str) -> str:
        if c not in self._seen:
            if _Splitter._tables is None:
                _Splitter._tables = [_starts_ends(_TABLE_L), _starts_ends(_TABLE_N)]
            self._seen[c] = _STAND_INS[2]
            for k, (starts, ends) in enumerate(_Splitter._tables):
                j = bisect.bisect_right(starts, ord(c)) - 1
                if j >= 0 and ord(c) <= ends[j]:
                    self._seen[c] = _STAND_INS[k]
        return self._seen[c]


_COMPILED: dict[str, _Splitter] = {}


def _compile(pattern: str) -> _Splitter:
    if pattern not in _COMPILED:
        _COMPILED[pattern] = _Splitter(pattern)
    return _COMPILED[pattern]


_BEHAVIORS = ("isolated", "removed", "contiguous", "mergedwithprevious", "merged_with_previous",
              "mergedwithnext", "merged_with_next")


def _split(text: str, rx: _Splitter, behavior: str = "Isolated", invert: bool = False) -> list[str]:
    """HF's Split pre-tokenizer: cut `text` at the matches of `rx`, keeping or
    merging the delimiters as `behavior` says."""
    if behavior in ("Isolated", "isolated") and not invert:  # the common case, kept fast
        out, pos = [], 0
        for a, b in rx.spans(text):
            if a < b:
                if pos < a:
                    out.append(text[pos:a])
                out.append(text[a:b])
                pos = b
        if pos < len(text):
            out.append(text[pos:])
        return out
    parts, pos = [], 0  # (start, end, is_delimiter)
    for a, b in rx.spans(text):
        if a == b:
            continue
        if pos < a:
            parts.append((pos, a, invert))
        parts.append((a, b, not invert))
        pos = b
    if pos < len(text):
        parts.append((pos, len(text), invert))
    behavior = behavior.lower()
    if behavior == "isolated":
        spans = [(a, b) for a, b, _ in parts]
    elif behavior == "removed":
        spans = [(a, b) for a, b, d in parts if not d]
    elif behavior == "contiguous":  # runs of delimiters, or of non-delimiters, merge
        spans, prev = [], False
        for a, b, d in parts:
            if d == prev and spans:
                spans[-1] = (spans[-1][0], b)
            else:
                spans.append((a, b))
            prev = d
    elif behavior in ("mergedwithprevious", "merged_with_previous"):
        spans, prev = [], False
        for a, b, d in parts:
            if d and not prev and spans:
                spans[-1] = (spans[-1][0], b)
            else:
                spans.append((a, b))
            prev = d
    elif behavior in ("mergedwithnext", "merged_with_next"):
        spans, prev = [], False
        for a, b, d in reversed(parts):
            if d and not prev and spans:
                spans[-1] = (a, spans[-1][1])
            else:
                spans.append((a, b))
            prev = d
        spans.reverse()
    else:
        raise NotImplementedError(f"Split behavior {behavior!r}")
    return [text[a:b] for a, b in spans]


def _byte_level(text: str) -> str:
    """UTF-8 bytes of `text`, each shown as its GPT-2 byte character."""
    return text.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_BYTE_CHARS)


def _is_word_char(ch: str) -> bool:
    return ch.isalnum() or ch == "_" or unicodedata.category(ch).startswith("M")


class _Added:
    """One added token (`added_tokens` entry of tokenizer.json)."""
    __slots__ = ("id", "content", "special", "normalized", "lstrip", "rstrip", "single_word")

    def __init__(self, id, content, special=True, normalized=False, lstrip=False,
                 rstrip=False, single_word=False, **_):
        self.id, self.content, self.special, self.normalized = id, content, special, normalized
        self.lstrip, self.rstrip, self.single_word = lstrip, rstrip, single_word


def _pre_steps(cfg) -> tuple[list, str | None]:
    """tokenizer.json `pre_tokenizer` -> list of str -> list[str] steps, and the
    GGUF name of the split (`llama-bpe`, `gpt-2`) when it is one we know."""
    if cfg is None:
        return [], None
    kind = cfg["type"]
    if kind == "Sequence":
        steps, names = [], []
        for sub in cfg["pretokenizers"]:
            s, name = _pre_steps(sub)
            steps += s
            names.append(name)
        named = [x for x in names if x not in (None, "bytes")]
        return steps, (named[0] if len(named) == 1 and "bytes" in names else None)
    if kind == "Split":
        pat = cfg["pattern"]
        source = pat["Regex"] if "Regex" in pat else re.escape(pat["String"])
        rx = _Splitter(pat["String"], literal=True) if "String" in pat else _compile(source)
        behavior, invert = cfg.get("behavior", "Isolated"), cfg.get("invert", False)
        if not isinstance(behavior, str) or not isinstance(invert, bool):
            raise TokenizerError(f"Split behavior {behavior!r} / invert {invert!r}: expected a string and a boolean")
        if behavior.lower() not in _BEHAVIORS:
            raise NotImplementedError(f"Split behavior {behavior!r}")
        name = "llama-bpe" if source == LLAMA3_SPLIT and behavior == "Isolated" and not invert else None
        return [lambda s: _split(s, rx, behavior, invert)], name
    if kind == "ByteLevel":
        prefix, use_regex = cfg.get("add_prefix_space", True), cfg.get("use_regex", True)
        gpt2 = _compile(GPT2_SPLIT)

        def step(s):
            if prefix and not s.startswith(" "):
                s = " " + s
            return [_byte_level(p) for p in (_split(s, gpt2) if use_regex else [s])]
        name = None if prefix else "gpt-2" if use_regex else "bytes"
        return [step], name
    raise NotImplementedError(f"pre_tokenizer {kind!r}")


def _post_ids(cfg) -> tuple[list[int], list[int]]:
    """tokenizer.json `post_processor` -> (ids before, ids after) one sequence."""
    if cfg is None or cfg["type"] == "ByteLevel":
        return [], []
    kind = cfg["type"]
    if kind == "Sequence":
        pre, post = [], []
        for sub in cfg["processors"]:
            a, b = _post_ids(sub)
            pre, post = pre + a, b + post
        return pre, post
    if kind == "TemplateProcessing":
        pre, post, seen = [], [], False
        for item in cfg["single"]:
            if "Sequence" in item:
                seen = True
                continue
            ids = cfg["special_tokens"][item["SpecialToken"]["id"]]["ids"]
            (post if seen else pre).extend(ids)
        return pre, post
    if kind in ("RobertaProcessing", "BertProcessing"):
        return [cfg["cls"][1]], [cfg["sep"][1]]
    raise NotImplementedError(f"post_processor {kind!r}")


class Tokenizer:
    """Byte-level BPE. Build with `from_json` (HF tokenizer.json) or
    `from_gguf_metadata` (GGUF `tokenizer.ggml.*` keys)."""

    def __init__(self, vocab: dict[str, int], merges: list, added: list[_Added], pre_steps: list,
                 pre_name: str | None, ignore_merges: bool = False, unk_token: str | None = None,
                 byte_decoder: bool = True, prefix_ids=(), suffix_ids=(), bos_id=None, eos_id=None,
                 pad_id=None):
        self._vocab = vocab
        self._added = added
        self._pre = pre_steps
        self.pre_name = pre_name
        self.ignore_merges = ignore_merges
        self._unk = vocab.get(unk_token) if unk_token is not None else None
        self._byte_decoder = byte_decoder
        self._prefix, self._suffix = list(prefix_ids), list(suffix_ids)
        all_ids = [*vocab.values(), *(t.id for t in added)]
        for i in all_ids:
            if type(i) is not int or not 0 <= i < len(all_ids) + MAX_ID_GAP:
                raise TokenizerError(f"token id {i!r} is not an integer in 0..{len(all_ids) + MAX_ID_GAP - 1}")
        for t in added:
            if not isinstance(t.content, str):
                raise TokenizerError(f"added token {t.id}: content {t.content!r} is not a string")
        self.vocab_size = 1 + max(all_ids, default=-1)
        for what, i in [*(("template", i) for i in (*self._prefix, *self._suffix)),
                        ("bos", bos_id), ("eos", eos_id), ("pad", pad_id)]:
            if (i is not None or what == "template") and (type(i) is not int or not 0 <= i < self.vocab_size):
                raise TokenizerError(f"{what} token id {i!r} is not an id of this vocabulary (0..{self.vocab_size - 1})")
        self._tokens: list[str | None] = [None] * self.vocab_size
        for s, i in vocab.items():
            self._tokens[i] = s
        for t in added:
            self._tokens[t.id] = t.content
        self._special = {t.id for t in added if t.special}
        # merges: "left right" -> rank. Keyed by the strings the file already holds,
        # so loading the 280k LLaMA-3 merges costs one dict build (ids are looked up
        # only for the words actually encoded, then cached).
        self._merge_list = [m if isinstance(m, str) else " ".join(m) for m in merges]
        self._ranks: dict[str, int] = {}
        for rank, m in enumerate(self._merge_list):
            self._ranks.setdefault(m, rank)
        # added tokens, HF order: first those matched on raw text, then normalized ones
        self._added_passes = []
        for normalized in (False, True):
            group = {t.content: t for t in added if bool(t.normalized) == normalized and t.content}
            if group:
                alts = sorted(group, key=len, reverse=True)  # longest first = leftmost-longest
                self._added_passes.append((re.compile("|".join(map(re.escape, alts))), group))
        self._cache: dict[str, list[int]] = {}
        self.bos_id, self.eos_id = bos_id, eos_id
        self.pad_id = pad_id if pad_id is not None else eos_id

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_json(cls, text_or_dict, config=None) -> "Tokenizer":
        """HF tokenizer.json (text or parsed). `config`: optional tokenizer_config.json
        (text or dict) naming bos_token / eos_token / pad_token; without it BOS is the
        post-processor's first special token, else a well-known name. Raises
        TokenizerError if malformed, NotImplementedError if unsupported."""
        try:
            return cls._from_json(text_or_dict, config)
        except (TokenizerError, NotImplementedError):
            raise
        except _MALFORMED as e:
            raise TokenizerError(f"tokenizer.json is malformed: {type(e).__name__}: {e}") from e

    @classmethod
    def _from_json(cls, text_or_dict, config=None) -> "Tokenizer":
        d = json.loads(text_or_dict) if isinstance(text_or_dict, (str, bytes)) else text_or_dict
        conf = json.loads(config) if isinstance(config, (str, bytes)) else (config or {})
        norm = d.get("normalizer")
        if norm is not None and not (norm["type"] == "Sequence" and not norm["normalizers"]):
            raise NotImplementedError(f"normalizer {norm['type']!r}")
        model = d["model"]
        if model.get("type", "BPE") != "BPE":
            raise NotImplementedError(f"model {model['type']!r}")
        for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
            if model.get(key):
                raise NotImplementedError(f"BPE {key}={model[key]!r}")
        if model.get("byte_fallback"):
            raise NotImplementedError("BPE byte_fallback")
        dec = d.get("decoder")
        if dec is not None and dec["type"] != "ByteLevel":
            raise NotImplementedError(f"decoder {dec['type']!r}")
        added = [_Added(**t) for t in d.get("added_tokens", [])]
        steps, pre_name = _pre_steps(d.get("pre_tokenizer"))
        pre_name = None if pre_name == "bytes" else pre_name
        prefix, suffix = _post_ids(d.get("post_processor"))
        ids = {**model["vocab"], **{t.content: t.id for t in added}}

        def named(key, fallbacks):  # the config's token, else the first known name
            v = conf.get(key)
            v = v.get("content") if isinstance(v, dict) else v
            return next((ids[name] for name in ([v] if v else fallbacks) if name in ids), None)
        bos = named("bos_token", ["<|begin_of_text|>", "<s>", "<|startoftext|>", "<|endoftext|>"])
        if prefix and not conf.get("bos_token"):
            bos = prefix[0]
        eos = named("eos_token", ["<|end_of_text|>", "</s>", "<|endoftext|>"])
        pad = (d.get("padding") or {}).get("pad_id")
        pad = named("pad_token", []) if conf.get("pad_token") else pad
        return cls(model["vocab"], model["merges"], added, steps, pre_name,
                   ignore_merges=model.get("ignore_merges", False), unk_token=model.get("unk_token"),
                   byte_decoder=dec is not None, prefix_ids=prefix, suffix_ids=suffix,
                   bos_id=bos, eos_id=eos, pad_id=pad)

    @classmethod
    def from_gguf_metadata(cls, meta: dict) -> "Tokenizer":
        """GGUF `tokenizer.ggml.*` keys (values as plain Python: str, int, bool, lists).
        Raises TokenizerError if malformed, NotImplementedError if unsupported."""
        try:
            return cls._from_gguf_metadata(meta)
        except (TokenizerError, NotImplementedError):
            raise
        except _MALFORMED as e:
            raise TokenizerError(f"GGUF tokenizer metadata is malformed: {type(e).__name__}: {e}") from e

    @classmethod
    def _from_gguf_metadata(cls, meta: dict) -> "Tokenizer":
        def text(v):
            return v.decode("utf-8") if isinstance(v, (bytes, bytearray)) else v
        kind = text(meta.get("tokenizer.ggml.model", "gpt2"))
        if kind != "gpt2":
            raise NotImplementedError(f"GGUF tokenizer model {kind!r} (only byte-level BPE, 'gpt2')")
        tokens = [text(t) for t in meta["tokenizer.ggml.tokens"]]
        types = list(meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens))
        merges = [text(m) for m in meta["tokenizer.ggml.merges"]]
        pre = text(meta.get("tokenizer.ggml.pre")) or "llama-bpe"
        if pre in ("llama-bpe", "llama3", "llama-v3"):
            steps, pre_name, ignore = [
                lambda s, rx=_compile(LLAMA3_SPLIT): _split(s, rx),
                _byte_level_list], "llama-bpe", True
        elif pre in ("gpt-2", "gpt2"):
            steps, pre_name, ignore = [
                lambda s, rx=_compile(GPT2_SPLIT): [_byte_level(p) for p in _split(s, rx)]], "gpt-2", False
        else:
            raise NotImplementedError(f"GGUF tokenizer.ggml.pre {pre!r}")
        vocab, added = {}, []
        for i, (tok, ty) in enumerate(zip(tokens, types)):
            if ty in (CONTROL, USER_DEFINED):
                added.append(_Added(i, tok, special=ty == CONTROL))
            elif ty != UNUSED:
                vocab.setdefault(tok, i)
        def maybe_int(key):
            return None if meta.get(key) is None else int(meta[key])
        bos, eos = maybe_int("tokenizer.ggml.bos_token_id"), maybe_int("tokenizer.ggml.eos_token_id")
        add_bos = meta.get("tokenizer.ggml.add_bos_token", pre_name == "llama-bpe")  # GGUF readers' default
        add_eos = meta.get("tokenizer.ggml.add_eos_token", False)
        return cls(vocab, merges, added, steps, pre_name, ignore_merges=ignore,
                   prefix_ids=[bos] if add_bos and bos is not None else [],
                   suffix_ids=[eos] if add_eos and eos is not None else [],
                   bos_id=bos, eos_id=eos, pad_id=maybe_int("tokenizer.ggml.padding_token_id"))

    def to_gguf_metadata(self) -> dict:
        """The `tokenizer.ggml.*` keys for a GGUF writer (ids with no token become
        `[PAD<i>]`, type UNUSED, as GGUF converters write them). GGUF cannot say
        lstrip / rstrip / single_word of added tokens, nor add_prefix_space, and its
        `llama-bpe` always means ignore_merges: texts relying on those may differ."""
        if self.pre_name is None:
            raise ValueError("this tokenizer's pre-tokenizer has no GGUF name")
        added = {t.id: t for t in self._added}
        tokens = [t if t is not None else f"[PAD{i}]" for i, t in enumerate(self._tokens)]
        types = [(CONTROL if added[i].special else USER_DEFINED) if i in added
                 else NORMAL if t is not None else UNUSED for i, t in enumerate(self._tokens)]
        meta = {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": self.pre_name,
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": list(self._merge_list),
            "tokenizer.ggml.add_bos_token": bool(self._prefix) and self._prefix == [self.bos_id],
        }
        for key, v in (("bos", self.bos_id), ("eos", self.eos_id), ("padding", self.pad_id)):
            if v is not None:
                meta[f"tokenizer.ggml.{key}_token_id"] = v
        return meta

    # ------------------------------------------------------------------ encoding
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; added tokens written in the text become their ids.
        With add_special_tokens, the template's BOS/EOS are added (as HF does)."""
        ids = list(self._prefix) if add_special_tokens else []
        for piece, tid in self._split_added(text):
            if tid is not None:
                ids.append(tid)
                continue
            words = [piece]
            for step in self._pre:
                words = [w for p in words for w in step(p) if w]
            for w in words:
                ids += self._bpe(w)
        if add_special_tokens:
            ids += self._suffix
        return ids

    def _split_added(self, text: str) -> list[tuple[str, int | None]]:
        pieces = [(text, None)]
        for rx, group in self._added_passes:
            out = []
            for s, tid in pieces:
                if tid is not None:
                    out.append((s, tid))
                    continue
                start_offset = 0
                for m in rx.finditer(s):
                    start, stop = m.span()
                    tok = group[m.group()]
                    if tok.single_word and not (
                            (start == 0 or not _is_word_char(s[start - 1]))
                            and (stop == len(s) or not _is_word_char(s[stop]))):
                        continue
                    if tok.lstrip:
                        j = start
                        while j > 0 and s[j - 1] in _WS_SET:
                            j -= 1
                        start = max(j, start_offset)
                    if tok.rstrip:
                        while stop < len(s) and s[stop] in _WS_SET:
                            stop += 1
                    if start_offset < start:
                        out.append((s[start_offset:start], None))
                    out.append((s[start:stop], tok.id))
                    start_offset = stop
                if start_offset < len(s):
                    out.append((s[start_offset:], None))
            pieces = out
        return [(s, tid) for s, tid in pieces if tid is not None or s]

    def _bpe(self, word: str) -> list[int]:
        ids = self._cache.get(word)
        if ids is not None:
            return ids
        vocab = self._vocab
        if self.ignore_merges and word in vocab:
            ids = [vocab[word]]
        else:
            ids = self._merge(word)
        if len(self._cache) > 100_000:
            self._cache.clear()
        self._cache[word] = ids
        return ids

    def _merge(self, word: str) -> list[int]:
        """HF's BPE merge order: always the lowest (rank, position) pair next, one
        occurrence at a time (a heap of candidate pairs, stale entries skipped)."""
        vocab, ranks = self._vocab, self._ranks
        unk = self._tokens[self._unk] if self._unk is not None else None
        syms = [ch if ch in vocab else unk for ch in word]
        syms = [s for s in syms if s is not None]  # no unk token: HF drops the character
        n = len(syms)
        nxt, prv, alive = [*range(1, n), -1], list(range(-1, n - 1)), [True] * n
        heap = [(r, i) for i in range(n - 1) if (r := ranks.get(syms[i] + " " + syms[i + 1])) is not None]
        heapq.heapify(heap)
        while heap:
            rank, i = heapq.heappop(heap)
            j = nxt[i]
            if not alive[i] or j < 0 or ranks.get(syms[i] + " " + syms[j]) != rank:
                continue
            syms[i] += syms[j]
            alive[j] = False
            nxt[i] = k = nxt[j]
            if k >= 0:
                prv[k] = i
                if (r := ranks.get(syms[i] + " " + syms[k])) is not None:
                    heapq.heappush(heap, (r, i))
            p = prv[i]
            if p >= 0 and (r := ranks.get(syms[p] + " " + syms[i])) is not None:
                heapq.heappush(heap, (r, p))
        try:
            return [vocab[s] for s, a in zip(syms, alive) if a]
        except KeyError as e:
            # not checked at load time (280k merges): a malformed file fails here
            raise TokenizerError(f"a merge makes {e.args[0]!r}, which is not in the vocab") from None

    # ------------------------------------------------------------------ decoding
    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """Text of `ids`; invalid UTF-8 becomes U+FFFD as in HF. Unknown ids are skipped."""
        toks = [self._tokens[i] for i in ids if 0 <= i < self.vocab_size and self._tokens[i] is not None
                and not (skip_special_tokens and i in self._special)]
        if not self._byte_decoder:
            return " ".join(toks)
        return b"".join(map(_token_bytes, toks)).decode("utf-8", errors="replace")

    def token_to_id(self, token: str) -> int | None:
        for t in self._added:
            if t.content == token:
                return t.id
        return self._vocab.get(token)

    def id_to_token(self, i: int) -> str | None:
        return self._tokens[i] if 0 <= i < self.vocab_size else None

    def __repr__(self):
        return (f"Tokenizer(V={self.vocab_size}, pre={self.pre_name}, merges={len(self._merge_list)}, "
                f"added={len(self._added)}, bos={self.bos_id}, eos={self.eos_id})")


def _token_bytes(t: str, _cache={}) -> bytes:
    """HF's ByteLevel decoder, per token: its GPT-2 byte characters as bytes, or its
    UTF-8 when some character is not one (an added token like `<|eot_id|>` is both)."""
    b = _cache.get(t)
    if b is None:
        try:
            b = bytes(CHAR_BYTES[c] for c in t)
        except KeyError:
            b = t.encode("utf-8")
        if len(_cache) < 500_000:
            _cache[t] = b
    return b


def _byte_level_list(s: str) -> list[str]:
    return [_byte_level(s)]


# ---------------------------------------------------------------------------
# What Oniguruma (as built into HF tokenizers 0.23) matches for \p{L}, \p{N} and \s,
# as hex code points and ranges. tests/test_tokenizer.py checks these against HF
# over every code point and prints a replacement if they ever differ.
_TABLE_L = """
41-5a 61-7a aa b5 ba c0-d6 d8-f6 f8-2c1 2c6-2d1 2e0-2e4 2ec 2ee 370-374 376-377
37a-37d 37f 386 388-38a 38c 38e-3a1 3a3-3f5 3f7-481 48a-52f 531-556 559 560-588
5d0-5ea 5ef-5f2 620-64a 66e-66f 671-6d3 6d5 6e5-6e6 6ee-6ef 6fa-6fc 6ff 710 712-72f
74d-7a5 7b1 7ca-7ea 7f4-7f5 7fa 800-815 81a 824 828 840-858 860-86a 870-887 889-88e
8a0-8c9 904-939 93d 950 958-961 971-980 985-98c 98f-990 993-9a8 9aa-9b0 9b2 9b6-9b9
9bd 9ce 9dc-9dd 9df-9e1 9f0-9f1 9fc a05-a0a a0f-a10 a13-a28 a2a-a30 a32-a33 a35-a36
a38-a39 a59-a5c a5e a72-a74 a85-a8d a8f-a91 a93-aa8 aaa-ab0 ab2-ab3 ab5-ab9 abd ad0
ae0-ae1 af9 b05-b0c b0f-b10 b13-b28 b2a-b30 b32-b33 b35-b39 b3d b5c-b5d b5f-b61 b71
b83 b85-b8a b8e-b90 b92-b95 b99-b9a b9c b9e-b9f ba3-ba4 ba8-baa bae-bb9 bd0 c05-c0c
c0e-c10 c12-c28 c2a-c39 c3d c58-c5a c5d c60-c61 c80 c85-c8c c8e-c90 c92-ca8 caa-cb3
cb5-cb9 cbd cdd-cde ce0-ce1 cf1-cf2 d04-d0c d0e-d10 d12-d3a d3d d4e d54-d56 d5f-d61
d7a-d7f d85-d96 d9a-db1 db3-dbb dbd dc0-dc6 e01-e30 e32-e33 e40-e46 e81-e82 e84
e86-e8a e8c-ea3 ea5 ea7-eb0 eb2-eb3 ebd ec0-ec4 ec6 edc-edf f00 f40-f47 f49-f6c
f88-f8c 1000-102a 103f 1050-1055 105a-105d 1061 1065-1066 106e-1070 1075-1081 108e
10a0-10c5 10c7 10cd 10d0-10fa 10fc-1248 124a-124d 1250-1256 1258 125a-125d 1260-1288
128a-128d 1290-12b0 12b2-12b5 12b8-12be 12c0 12c2-12c5 12c8-12d6 12d8-1310 1312-1315
1318-135a 1380-138f 13a0-13f5 13f8-13fd 1401-166c 166f-167f 1681-169a 16a0-16ea
16f1-16f8 1700-1711 171f-1731 1740-1751 1760-176c 176e-1770 1780-17b3 17d7 17dc
1820-1878 1880-1884 1887-18a8 18aa 18b0-18f5 1900-191e 1950-196d 1970-1974 1980-19ab
19b0-19c9 1a00-1a16 1a20-1a54 1aa7 1b05-1b33 1b45-1b4c 1b83-1ba0 1bae-1baf 1bba-1be5
1c00-1c23 1c4d-1c4f 1c5a-1c7d 1c80-1c8a 1c90-1cba 1cbd-1cbf 1ce9-1cec 1cee-1cf3
1cf5-1cf6 1cfa 1d00-1dbf 1e00-1f15 1f18-1f1d 1f20-1f45 1f48-1f4d 1f50-1f57 1f59 1f5b
1f5d 1f5f-1f7d 1f80-1fb4 1fb6-1fbc 1fbe 1fc2-1fc4 1fc6-1fcc 1fd0-1fd3 1fd6-1fdb
1fe0-1fec 1ff2-1ff4 1ff6-1ffc 2071 207f 2090-209c 2102 2107 210a-2113 2115 2119-211d
2124 2126 2128 212a-212d 212f-2139 213c-213f 2145-2149 214e 2183-2184 2c00-2ce4
2ceb-2cee 2cf2-2cf3 2d00-2d25 2d27 2d2d 2d30-2d67 2d6f 2d80-2d96 2da0-2da6 2da8-2dae
2db0-2db6 2db8-2dbe 2dc0-2dc6 2dc8-2dce 2dd0-2dd6 2dd8-2dde 2e2f 3005-3006 3031-3035
303b-303c 3041-3096 309d-309f 30a1-30fa 30fc-30ff 3105-312f 3131-318e 31a0-31bf
31f0-31ff 3400-4dbf 4e00-a48c a4d0-a4fd a500-a60c a610-a61f a62a-a62b a640-a66e
a67f-a69d a6a0-a6e5 a717-a71f a722-a788 a78b-a7cd a7d0-a7d1 a7d3 a7d5-a7dc a7f2-a801
a803-a805 a807-a80a a80c-a822 a840-a873 a882-a8b3 a8f2-a8f7 a8fb a8fd-a8fe a90a-a925
a930-a946 a960-a97c a984-a9b2 a9cf a9e0-a9e4 a9e6-a9ef a9fa-a9fe aa00-aa28 aa40-aa42
aa44-aa4b aa60-aa76 aa7a aa7e-aaaf aab1 aab5-aab6 aab9-aabd aac0 aac2 aadb-aadd
aae0-aaea aaf2-aaf4 ab01-ab06 ab09-ab0e ab11-ab16 ab20-ab26 ab28-ab2e ab30-ab5a
ab5c-ab69 ab70-abe2 ac00-d7a3 d7b0-d7c6 d7cb-d7fb f900-fa6d fa70-fad9 fb00-fb06
fb13-fb17 fb1d fb1f-fb28 fb2a-fb36 fb38-fb3c fb3e fb40-fb41 fb43-fb44 fb46-fbb1
fbd3-fd3d fd50-fd8f fd92-fdc7 fdf0-fdfb fe70-fe74 fe76-fefc ff21-ff3a ff41-ff5a
ff66-ffbe ffc2-ffc7 ffca-ffcf ffd2-ffd7 ffda-ffdc 10000-1000b 1000d-10026
10028-1003a 1003c-1003d 1003f-1004d 10050-1005d 10080-100fa 10280-1029c 102a0-102d0
10300-1031f 1032d-10340 10342-10349 10350-10375 10380-1039d 103a0-103c3 103c8-103cf
10400-1049d 104b0-104d3 104d8-104fb 10500-10527 10530-10563 10570-1057a 1057c-1058a
1058c-10592 10594-10595 10597-105a1 105a3-105b1 105b3-105b9 105bb-105bc 105c0-105f3
10600-10736 10740-10755 10760-10767 10780-10785 10787-107b0 107b2-107ba 10800-10805
10808 1080a-10835 10837-10838 1083c 1083f-10855 10860-10876 10880-1089e 108e0-108f2
108f4-108f5 10900-10915 10920-10939 10980-109b7 109be-109bf 10a00 10a10-10a13
10a15-10a17 10a19-10a35 10a60-10a7c 10a80-10a9c 10ac0-10ac7 10ac9-10ae4 10b00-10b35
10b40-10b55 10b60-10b72 10b80-10b91 10c00-10c48 10c80-10cb2 10cc0-10cf2 10d00-10d23
10d4a-10d65 10d6f-10d85 10e80-10ea9 10eb0-10eb1 10ec2-10ec4 10f00-10f1c 10f27
10f30-10f45 10f70-10f81 10fb0-10fc4 10fe0-10ff6 11003-11037 11071-11072 11075
11083-110af 110d0-110e8 11103-11126 11144 11147 11150-11172 11176 11183-111b2
111c1-111c4 111da 111dc 11200-11211 11213-1122b 1123f-11240 11280-11286 11288
1128a-1128d 1128f-1129d 1129f-112a8 112b0-112de 11305-1130c 1130f-11310 11313-11328
1132a-11330 11332-11333 11335-11339 1133d 11350 1135d-11361 11380-11389 1138b 1138e
11390-113b5 113b7 113d1 113d3 11400-11434 11447-1144a 1145f-11461 11480-114af
114c4-114c5 114c7 11580-115ae 115d8-115db 11600-1162f 11644 11680-116aa 116b8
11700-1171a 11740-11746 11800-1182b 118a0-118df 118ff-11906 11909 1190c-11913
11915-11916 11918-1192f 1193f 11941 119a0-119a7 119aa-119d0 119e1 119e3 11a00
11a0b-11a32 11a3a 11a50 11a5c-11a89 11a9d 11ab0-11af8 11bc0-11be0 11c00-11c08
11c0a-11c2e 11c40 11c72-11c8f 11d00-11d06 11d08-11d09 11d0b-11d30 11d46 11d60-11d65
11d67-11d68 11d6a-11d89 11d98 11ee0-11ef2 11f02 11f04-11f10 11f12-11f33 11fb0
12000-12399 12480-12543 12f90-12ff0 13000-1342f 13441-13446 13460-143fa 14400-14646
16100-1611d 16800-16a38 16a40-16a5e 16a70-16abe 16ad0-16aed 16b00-16b2f 16b40-16b43
16b63-16b77 16b7d-16b8f 16d40-16d6c 16e40-16e7f 16f00-16f4a 16f50 16f93-16f9f
16fe0-16fe1 16fe3 17000-187f7 18800-18cd5 18cff-18d08 1aff0-1aff3 1aff5-1affb
1affd-1affe 1b000-1b122 1b132 1b150-1b152 1b155 1b164-1b167 1b170-1b2fb 1bc00-1bc6a
1bc70-1bc7c 1bc80-1bc88 1bc90-1bc99 1d400-1d454 1d456-1d49c 1d49e-1d49f 1d4a2
1d4a5-1d4a6 1d4a9-1d4ac 1d4ae-1d4b9 1d4bb 1d4bd-1d4c3 1d4c5-1d505 1d507-1d50a
1d50d-1d514 1d516-1d51c 1d51e-1d539 1d53b-1d53e 1d540-1d544 1d546 1d54a-1d550
1d552-1d6a5 1d6a8-1d6c0 1d6c2-1d6da 1d6dc-1d6fa 1d6fc-1d714 1d716-1d734 1d736-1d74e
1d750-1d76e 1d770-1d788 1d78a-1d7a8 1d7aa-1d7c2 1d7c4-1d7cb 1df00-1df1e 1df25-1df2a
1e030-1e06d 1e100-1e12c 1e137-1e13d 1e14e 1e290-1e2ad 1e2c0-1e2eb 1e4d0-1e4eb
1e5d0-1e5ed 1e5f0 1e7e0-1e7e6 1e7e8-1e7eb 1e7ed-1e7ee 1e7f0-1e7fe 1e800-1e8c4
1e900-1e943 1e94b 1ee00-1ee03 1ee05-1ee1f 1ee21-1ee22 1ee24 1ee27 1ee29-1ee32
1ee34-1ee37 1ee39 1ee3b 1ee42 1ee47 1ee49 1ee4b 1ee4d-1ee4f 1ee51-1ee52 1ee54 1ee57
1ee59 1ee5b 1ee5d 1ee5f 1ee61-1ee62 1ee64 1ee67-1ee6a 1ee6c-1ee72 1ee74-1ee77
1ee79-1ee7c 1ee7e 1ee80-1ee89 1ee8b-1ee9b 1eea1-1eea3 1eea5-1eea9 1eeab-1eebb
20000-2a6df 2a700-2b739 2b740-2b81d 2b820-2cea1 2ceb0-2ebe0 2ebf0-2ee5d 2f800-2fa1d
30000-3134a 31350-323af"""
_TABLE_N = """
30-39 b2-b3 b9 bc-be 660-669 6f0-6f9 7c0-7c9 966-96f 9e6-9ef 9f4-9f9 a66-a6f ae6-aef
b66-b6f b72-b77 be6-bf2 c66-c6f c78-c7e ce6-cef d58-d5e d66-d78 de6-def e50-e59
ed0-ed9 f20-f33 1040-1049 1090-1099 1369-137c 16ee-16f0 17e0-17e9 17f0-17f9
1810-1819 1946-194f 19d0-19da 1a80-1a89 1a90-1a99 1b50-1b59 1bb0-1bb9 1c40-1c49
1c50-1c59 2070 2074-2079 2080-2089 2150-2182 2185-2189 2460-249b 24ea-24ff 2776-2793
2cfd 3007 3021-3029 3038-303a 3192-3195 3220-3229 3248-324f 3251-325f 3280-3289
32b1-32bf a620-a629 a6e6-a6ef a830-a835 a8d0-a8d9 a900-a909 a9d0-a9d9 a9f0-a9f9
aa50-aa59 abf0-abf9 ff10-ff19 10107-10133 10140-10178 1018a-1018b 102e1-102fb
10320-10323 10341 1034a 103d1-103d5 104a0-104a9 10858-1085f 10879-1087f 108a7-108af
108fb-108ff 10916-1091b 109bc-109bd 109c0-109cf 109d2-109ff 10a40-10a48 10a7d-10a7e
10a9d-10a9f 10aeb-10aef 10b58-10b5f 10b78-10b7f 10ba9-10baf 10cfa-10cff 10d30-10d39
10d40-10d49 10e60-10e7e 10f1d-10f26 10f51-10f54 10fc5-10fcb 11052-1106f 110f0-110f9
11136-1113f 111d0-111d9 111e1-111f4 112f0-112f9 11450-11459 114d0-114d9 11650-11659
116c0-116c9 116d0-116e3 11730-1173b 118e0-118f2 11950-11959 11bf0-11bf9 11c50-11c6c
11d50-11d59 11da0-11da9 11f50-11f59 11fc0-11fd4 12400-1246e 16130-16139 16a60-16a69
16ac0-16ac9 16b50-16b59 16b5b-16b61 16d70-16d79 16e80-16e96 1ccf0-1ccf9 1d2c0-1d2d3
1d2e0-1d2f3 1d360-1d378 1d7ce-1d7ff 1e140-1e149 1e2f0-1e2f9 1e4f0-1e4f9 1e5f1-1e5fa
1e8c7-1e8cf 1e950-1e959 1ec71-1ecab 1ecad-1ecaf 1ecb1-1ecb4 1ed01-1ed2d 1ed2f-1ed3d
1f100-1f10c 1fbf0-1fbf9"""
