"""bitlora.data against alpaca-lora's tokenization (re-implemented here on a
transformers fast tokenizer over the LLaMA-3 tokenizer.json), plus malformed
datasets, batching, step grouping and resume."""
from __future__ import annotations

import json
import pathlib

import pytest

from bitlora.data import (DataError, Dataset, format_prompt, load_records, parse_records,
                          tokenize_record)

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOKENIZER_JSON = ROOT / "node_modules" / "@lenml" / "tokenizer-llama3" / "models" / "tokenizer.json"
ALPACA_TINY = ROOT.parent / "shared" / "data" / "alpaca_tiny.json"

needs_tokenizer = pytest.mark.skipif(not TOKENIZER_JSON.exists(), reason="LLaMA-3 tokenizer.json not installed (npm)")


class _HFTok:
    """The interface bitlora.data needs, backed by HF tokenizers (used only if
    bitlora.tokenizer is missing)."""
    def __init__(self, path):
        from tokenizers import Tokenizer
        self.t = Tokenizer.from_file(str(path))
        self.bos_id = self.t.token_to_id("<|begin_of_text|>")
        self.eos_id = self.t.token_to_id("<|end_of_text|>")
        self.pad_id = None

    def encode(self, text, add_special_tokens=False):
        return self.t.encode(text, add_special_tokens=add_special_tokens).ids


@pytest.fixture(scope="module")
def tok():
    if not TOKENIZER_JSON.exists():
        pytest.skip("LLaMA-3 tokenizer.json not installed (npm)")
    try:
        from bitlora.tokenizer import Tokenizer
        return Tokenizer.from_json(TOKENIZER_JSON.read_text(encoding="utf-8"))
    except ImportError:
        return _HFTok(TOKENIZER_JSON)


@pytest.fixture(scope="module")
def hf_tok(tok):
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast
    # This tokenizer.json predates BOS in the post-processor; give it the template of
    # Meta's LLaMA-3 tokenizer.json (BOS first), as alpaca-lora's LLaMA tokenizer has.
    raw = Tokenizer.from_file(str(TOKENIZER_JSON))
    bos = raw.id_to_token(tok.bos_id)
    raw.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.bos_id)])
    t = PreTrainedTokenizerFast(tokenizer_object=raw)
    t.bos_token = t.convert_ids_to_tokens(tok.bos_id)
    t.eos_token = t.convert_ids_to_tokens(tok.eos_id)
    return t


def alpaca_lora_reference(hf_tok, rec, cutoff_len, train_on_inputs):
    """tloen/alpaca-lora finetune.py tokenize / generate_and_tokenize_prompt, rewritten."""
    def tokenize(text, add_eos_token=True):
        ids = hf_tok(text, truncation=True, max_length=cutoff_len, padding=False)["input_ids"]
        if ids[-1] != hf_tok.eos_token_id and len(ids) < cutoff_len and add_eos_token:
            ids.append(hf_tok.eos_token_id)
        return ids
    ids = tokenize(format_prompt(rec, with_output=True))
    labels = list(ids)
    if not train_on_inputs:
        n = len(tokenize(format_prompt(rec), add_eos_token=False))
        labels = [-100] * n + labels[n:]
    return ids, labels


def _edge_records():
    long_out = "word " * 400
    return [
        {"instruction": "Say hi.", "input": "", "output": "Hi!"},
        {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
        {"instruction": "Echo", "input": "ünïcödé ✓ 漢字", "output": "ünïcödé ✓ 漢字\n\n"},
        {"instruction": "Long one", "output": long_out},                     # no input key
        {"instruction": "Empty output", "input": "", "output": ""},
        {"instruction": "x " * 20, "input": "", "output": "tail after prompt"},
    ]


def _records():
    recs = _edge_records()
    if ALPACA_TINY.exists():
        recs = json.loads(ALPACA_TINY.read_text(encoding="utf-8")) + recs
    return recs


@needs_tokenizer
@pytest.mark.parametrize("cutoff_len", [256, 60, 2])
@pytest.mark.parametrize("train_on_inputs", [False, True])
def test_tokens_and_mask_match_alpaca_lora(tok, hf_tok, cutoff_len, train_on_inputs):
    checked = 0
    for rec in _records():
        ids, mask = tokenize_record(tok, rec, cutoff_len, train_on_inputs)
        ref_ids, ref_labels = alpaca_lora_reference(hf_tok, rec, cutoff_len, train_on_inputs)
        assert ids == ref_ids, rec
        assert len(ids) <= cutoff_len
        # HF's causal shift ignores labels[0]; beyond that, mask == (label != -100).
        assert mask[0] == 0
        assert mask[1:] == [int(l != -100) for l in ref_labels[1:len(ids)]], rec
        checked += 1
    assert checked >= 6


@needs_tokenizer
def test_cut_sequences_have_no_eos_and_short_ones_do(tok):
    short = tokenize_record(tok, {"instruction": "a", "output": "b"}, 256, False)[0]
    assert short[0] == tok.bos_id and short[-1] == tok.eos_id
    cut = tokenize_record(tok, {"instruction": "a", "output": "b " * 300}, 64, False)[0]
    assert len(cut) == 64 and cut[-1] != tok.eos_id


@needs_tokenizer
def test_invalid_records_reported_by_index(tok):
    recs = [
        {"instruction": "ok", "input": "", "output": "fine"},          # 0 valid
        {"input": "", "output": "no instruction"},                      # 1
        {"instruction": "no output"},                                    # 2
        {"instruction": 3, "output": "x"},                              # 3
        {"instruction": "i", "input": ["x"], "output": "x"},            # 4
        "not an object",                                                 # 5
        {"instruction": "long prompt " * 100, "output": "cut away"},    # 6 no target after cut
        {"instruction": "null input", "input": None, "output": "y"},   # 7 valid
    ]
    ds = Dataset(recs, tok, cutoff_len=64, train_on_inputs=False)
    bad = dict(ds.invalid)
    assert sorted(bad) == [1, 2, 3, 4, 5, 6]
    assert "instruction" in bad[1] and "output" in bad[2] and "instruction" in bad[3]
    assert "input" in bad[4] and "object" in bad[5] and "cutoff_len" in bad[6]
    assert [i for i, _, _ in ds.examples] == [0, 7]
    # with train_on_inputs the prompt itself is a target, so record 6 stays
    ds2 = Dataset(recs, tok, cutoff_len=64, train_on_inputs=True)
    assert 6 not in dict(ds2.invalid)


def test_malformed_files(tmp_path):
    with pytest.raises(DataError, match="not JSON"):
        parse_records("[{\"a\": 1},", "x.json")
    with pytest.raises(DataError, match="list"):
        parse_records("42", "x.json")
    with pytest.raises(DataError, match="list"):
        parse_records('{\n "instruction": "a",\n "output": "b"\n}', "x.json")
    with pytest.raises(DataError, match="empty"):
        parse_records("  \n", "x.json")
    p = tmp_path / "d.bin"
    p.write_bytes(b"\xff\xfe[\x00")
    with pytest.raises(DataError, match="UTF-8"):
        load_records(p)
    with pytest.raises(DataError, match="cannot read"):
        load_records(str(tmp_path / "missing.json"))


def test_jsonl_broken_line_is_reported(tmp_path):
    lines = ['{"instruction": "a", "output": "b"}', '{"instruction": "c", "outp', "",
             '[1, 2]', '{"instruction": "d", "output": "e"}']
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(lines) + "\n")
    recs = load_records(p)
    assert len(recs) == 4             # blank lines are not records
    tok = _CharTok()
    ds = Dataset(recs, tok, cutoff_len=512)
    bad = dict(ds.invalid)
    assert sorted(bad) == [1, 2] and "JSON" in bad[1] and "object" in bad[2]
    assert [i for i, _, _ in ds.examples] == [0, 3]


def test_jsonl_lines_end_at_newlines_only(tmp_path):
    """U+2028, U+2029 and U+0085 may stand raw inside a JSON string (json.dumps with
    ensure_ascii=False writes them so): they do not end a JSONL line; \r\n and \r do."""
    recs = [{"instruction": "line\u2028sep, \u0085 NEL", "input": "", "output": "ok\u2029done"},
            {"instruction": "Add.", "input": "2 and 3", "output": "5"}]
    body = [json.dumps(r, ensure_ascii=False) for r in recs]
    for sep in ("\n", "\r\n", "\r"):
        p = tmp_path / "d.jsonl"
        p.write_bytes((sep.join(body) + sep).encode())
        assert load_records(p) == recs, repr(sep)


def test_an_integer_too_long_for_python_is_a_data_error():
    """json.loads refuses integers over 4300 digits with a plain ValueError: a DataError
    naming the file (JSON), a skipped line (JSONL)."""
    big = "9" * 5000
    with pytest.raises(DataError, match="x.json: not JSON"):
        parse_records(f'[{{"instruction": "a", "output": "b", "n": {big}}}]', "x.json")
    recs = parse_records(f'{{"instruction": "a", "output": "b", "n": {big}}}\n{{"instruction": "c", "output": "d"}}',
                         "x.jsonl", jsonl=True)
    assert recs[1] == {"instruction": "c", "output": "d"} and "invalid JSON line" in recs[0].reason


def test_load_sources_agree(tmp_path):
    recs = [{"instruction": "a", "input": "", "output": "b"}, {"instruction": "c", "output": "d"}]
    text = json.dumps(recs)
    p = tmp_path / "d.json"
    p.write_text(text)
    jl = tmp_path / "d.jsonl"
    jl.write_text("\n".join(json.dumps(r) for r in recs))
    for src in (recs, text, text.encode(), p, str(p), jl, "\n".join(json.dumps(r) for r in recs)):
        assert load_records(src) == recs


# -- batching with a toy tokenizer (one id per character) ------------------------------

class _CharTok:
    bos_id, eos_id, pad_id = 1, 2, 0

    def encode(self, text, add_special_tokens=False):
        return [3 + (ord(c) % 250) for c in text]


def _toy_dataset(n=23, **kw):
    recs = [{"instruction": f"q{i}", "input": "", "output": "a" * (i % 7)} for i in range(n)]
    return Dataset(recs, _CharTok(), cutoff_len=kw.pop("cutoff_len", 512), **kw)


def test_micro_batches_pad_and_mask():
    ds = _toy_dataset()
    steps = list(ds.steps(micro_batch_size=4, grad_accum=2, epochs=1, shuffle=False))
    mb = steps[0].micro_batches[0]
    assert mb.B == 4 and mb.T == max(mb.lengths) and len(mb.ids) == len(mb.mask) == mb.B * mb.T
    for b in range(mb.B):
        row, m = mb.ids[b * mb.T:(b + 1) * mb.T], mb.mask[b * mb.T:(b + 1) * mb.T]
        L = mb.lengths[b]
        assert row[L:] == [0] * (mb.T - L) and m[L:] == [0] * (mb.T - L)
        _, ids, mask = ds.examples[mb.indices[b]]
        assert row[:L] == ids and m[:L] == mask
    tg = mb.targets
    assert sum(t >= 0 for t in tg) == mb.n_targets == sum(mb.mask)
    for i, t in enumerate(tg):
        if t >= 0:
            assert t == mb.ids[i + 1] and mb.mask[i + 1] == 1 and (i + 1) % mb.T != 0


def test_steps_group_micro_batches_and_cover_each_epoch():
    ds = _toy_dataset(23)                      # 6 micro-batches of 4 (last holds 3)
    assert ds.micro_batches_per_epoch(4) == 6 and ds.steps_per_epoch(4, 4) == 2
    steps = list(ds.steps(micro_batch_size=4, grad_accum=4, epochs=3, seed=7))
    assert len(steps) == ds.total_steps(4, 4, 3) == 6
    assert [len(s.micro_batches) for s in steps] == [4, 2] * 3
    assert [s.epoch for s in steps] == [0, 0, 1, 1, 2, 2]
    for e in range(3):
        seen = [i for s in steps if s.epoch == e for mb in s.micro_batches for i in mb.indices]
        assert sorted(seen) == list(range(23))
    assert [s.n_targets for s in steps] == [sum(mb.n_targets for mb in s.micro_batches) for s in steps]
    for e in range(3):
        assert list(ds.batches(e, 4, seed=7)) == [mb for s in steps if s.epoch == e for mb in s.micro_batches]
    orders = [[i for mb in s.micro_batches for i in mb.indices] for s in steps[::2]]
    assert orders[0] != orders[1]              # reshuffled per epoch
    again = list(ds.steps(micro_batch_size=4, grad_accum=4, epochs=3, seed=7))
    assert [s.micro_batches for s in again] == [s.micro_batches for s in steps]
    other = list(ds.steps(micro_batch_size=4, grad_accum=4, epochs=3, seed=8))
    assert [s.micro_batches for s in other] != [s.micro_batches for s in steps]


def test_no_shuffle_is_file_order_and_max_steps_cycles():
    ds = _toy_dataset(10)
    steps = list(ds.steps(micro_batch_size=3, grad_accum=1, epochs=1, shuffle=False, max_steps=9))
    assert len(steps) == 9
    flat = [i for s in steps for mb in s.micro_batches for i in mb.indices]
    assert flat[:10] == list(range(10)) and flat[10:20] == list(range(10))
    assert [s.epoch for s in steps] == [0] * 4 + [1] * 4 + [2]


def test_resume_from_any_cursor_continues_identically():
    ds = _toy_dataset(23)
    kw = dict(micro_batch_size=4, grad_accum=3, epochs=3, seed=3)
    full = list(ds.steps(**kw))
    for k in range(len(full)):
        cursor = json.loads(json.dumps(full[k].cursor))     # it must survive JSON
        rest = list(ds.steps(cursor=cursor, **kw))
        assert [s.micro_batches for s in rest] == [s.micro_batches for s in full[k + 1:]]
        assert [s.index for s in rest] == list(range(k + 1, len(full)))


def test_fingerprint_changes_with_data():
    assert _toy_dataset(5).fingerprint() == _toy_dataset(5).fingerprint()
    assert _toy_dataset(5).fingerprint() != _toy_dataset(6).fingerprint()


def test_no_usable_record_is_an_error():
    with pytest.raises(DataError, match="no usable record"):
        Dataset([{"output": "x"}], _CharTok())


def test_resume_with_other_data_or_layout_is_refused():
    ds = _toy_dataset(23)
    cur = next(iter(ds.steps(micro_batch_size=4, grad_accum=2, epochs=1, seed=1))).cursor
    with pytest.raises(DataError, match="dataset"):
        next(iter(_toy_dataset(22).steps(micro_batch_size=4, grad_accum=2, epochs=1, seed=1, cursor=cur)))
    with pytest.raises(DataError, match="micro_batch_size"):
        next(iter(ds.steps(micro_batch_size=4, grad_accum=2, epochs=1, seed=2, cursor=cur)))


def test_config_helpers():
    from bitlora.config import TrainConfig
    from bitlora.data import dataset_for
    recs = [{"instruction": f"q{i}", "output": "a"} for i in range(9)]
    cfg = TrainConfig(micro_batch_size=2, grad_accum=2, epochs=2, cutoff_len=256, seed=5)
    ds = dataset_for(cfg, _CharTok(), recs)
    assert ds.total_steps_for(cfg) == 6
    assert [s.micro_batches for s in ds.steps_for(cfg)] == \
        [s.micro_batches for s in ds.steps(2, 2, 2, seed=5)]


PORTABLE_RECORDS = "\n".join(json.dumps(r) for r in [
    {"instruction": f"task {i}", "input": "ctx" * (i % 3), "output": "out " * (i % 5)} for i in range(13)
]) + "\n{broken"
PORTABLE_CONFIG = {"micro_batch_size": 3, "grad_accum": 2, "epochs": 2, "seed": 9, "cutoff_len": 180,
                   "lora_r": 2, "target_modules": ["q_proj", "down_proj"], "lr_scheduler": "cosine",
                   "warmup_steps": 1}
PORTABLE_HF = dict(hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1)


def test_portable_pipeline_matches_native(run_case):
    """Data order, batches, schedule, LoRA init and file bytes: the browser's answer
    equals CPython's (computed here, in-process)."""
    import data_cases

    from bitlora import gpu
    kw = dict(jsonl_text=PORTABLE_RECORDS, config=PORTABLE_CONFIG, hf_config=PORTABLE_HF)
    # gpu.run, not asyncio.run: Playwright's sync API may already run a loop in this thread
    here = json.loads(json.dumps(gpu.run(data_cases.case_pipeline(None, **kw))))
    got = run_case("data_cases", "case_pipeline", **kw)
    assert got["adapter_round_trip"] is True
    reasons = dict(got["invalid"])
    assert "JSON" in reasons[13] and any("cutoff_len" in r for r in reasons.values())
    assert len(got["steps"]) >= 2 and got["steps"][0]["lr"] == 0.0
    assert got == here


def test_demo_dataset_is_clean():
    recs = load_records("demo")
    ds = Dataset(recs, _CharTok(), cutoff_len=2048)
    assert len(recs) > 0 and ds.invalid == []


def test_an_example_past_the_models_vocabulary_is_skipped_with_the_reason():
    """A tokenizer with more tokens than the embedding: such an example is skipped when
    the data is read (naming the id), not an error at the first step."""
    recs = [{"instruction": "ab", "output": "c"}, {"instruction": "a\u00f9", "output": "b"}]   # \u00f9: id 3 + 249
    ds = Dataset(recs, _CharTok(), cutoff_len=512, vocab_size=200)
    assert [i for i, _, _ in ds.examples] == [0] and ds.invalid[0][0] == 1
    assert "token id 252 is outside the model's vocabulary (200)" in ds.invalid[0][1]
    assert len(Dataset(recs, _CharTok(), cutoff_len=512).examples) == 2


def test_deep_nesting_is_refused_before_parsing():
    """A file of arrays or objects nested 100 deep or more is refused before json.loads
    (in the browser such a parse overflows the JS stack and kills Pyodide)."""
    for text in ("[" * 100000 + "]" * 100000, '{"a": ' * 150 + "1" + "}" * 150, "[" * 100 + "]" * 100):
        with pytest.raises(DataError, match="nested 100 deep"):
            parse_records(text, "x.json")
    assert parse_records("[" * 2 + '{"instruction": "a", "output": "b"}' + "]" * 2, "x.json") == [[{"instruction": "a", "output": "b"}]]
