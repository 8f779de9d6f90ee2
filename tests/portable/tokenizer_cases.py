"""Portable cases for the tokenizer: the same encode/decode natively and in Pyodide.

The browser cannot read the repo's files, so the tokenizer arrives as JSON text
(a small byte-level BPE trained by the pytest side); pytest compares the answer
with HF `tokenizers`. `dev` is unused: tokenizing needs no GPU.
"""
import time

from bitlora.tokenizer import Tokenizer


async def case_encode(dev, tokenizer_json, texts, add_special_tokens=False):
    t0 = time.perf_counter()
    tok = Tokenizer.from_json(tokenizer_json)
    t1 = time.perf_counter()
    ids = [tok.encode(t, add_special_tokens=add_special_tokens) for t in texts]
    t2 = time.perf_counter()
    return {
        "load_ms": 1e3 * (t1 - t0),
        "encode_ms": 1e3 * (t2 - t1),
        "ids": ids,
        "decoded": [tok.decode(i) for i in ids],
        "decoded_skip": [tok.decode(i, skip_special_tokens=True) for i in ids],
        "bos_id": tok.bos_id,
        "eos_id": tok.eos_id,
        "vocab_size": tok.vocab_size,
    }


async def case_gguf_roundtrip(dev, tokenizer_json, texts):
    """tokenizer.json -> GGUF metadata -> tokenizer: the same ids."""
    tok = Tokenizer.from_json(tokenizer_json)
    again = Tokenizer.from_gguf_metadata(tok.to_gguf_metadata())
    return [[tok.encode(t), again.encode(t)] for t in texts]
