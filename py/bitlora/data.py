"""Alpaca data: records -> prompts -> tokens and loss masks -> micro-batches -> steps.

    records = load_records("alpaca.json")          # or .jsonl, bytes, text, a list of dicts
    ds = Dataset(records, tok, cutoff_len=256, train_on_inputs=False)   # or dataset_for(cfg, tok)
    ds.invalid                                     # [(index, reason)], skipped records
    for step in ds.steps(micro_batch_size=4, grad_accum=4, epochs=3, seed=42):   # or steps_for(cfg)
        for mb in step.micro_batches: ...          # mb.ids[B*T], mb.mask[B*T], mb.targets[B*T]
        save(step.cursor)                          # resume: ds.steps(..., cursor=step.cursor)

Tokens follow tloen/alpaca-lora's generate_and_tokenize_prompt with a tokenizer that
adds BOS: ids = ([BOS] + encode(prompt + output))[:cutoff_len], then EOS is appended
if the result is shorter than cutoff_len and does not already end in EOS (so a cut
sequence has no EOS). Unless train_on_inputs, the first len(([BOS] +
encode(prompt))[:cutoff_len]) positions are not targets.

`mask[t] = 1` means ids[t] is a target: the loss includes -log p(ids[t] | ids[:t]).
Position 0 is never a target (nothing predicts it), so sum(mask) is the number of
target tokens, equal to the count of HF labels != -100 after the causal shift. The
cross-entropy kernel wants the shifted form, `targets[t] = ids[t+1] if mask[t+1]
else -1`, which MicroBatch provides.

Records are {instruction, input, output} with string values; `input` may be missing
or null (= ""), other keys are ignored. A record with a missing or non-string
field, a JSONL line that is not a JSON object, or a record with no target left after
the cut is reported in `Dataset.invalid` as (index, reason) and skipped.

Micro-batches are right-padded to the longest sequence in the micro-batch (T), with
pad id = tok.pad_id (or EOS) and mask 0, so under causal attention the real tokens
never see padding and no attention mask is needed.

Order: with shuffling, epoch e visits the records in the order
random.Random(f"bitlora-data:{seed}:{e}").shuffle(list(range(n))) -- a pure function
of (seed, epoch), the same in CPython and Pyodide; without, in file order. Each epoch
is cut into ceil(n / micro_batch_size) micro-batches (the last may be smaller), and
every grad_accum of them make one optimizer step (the last step of an epoch may
have fewer), as the HF Trainer does. A cursor {epoch, micro_batch, step, ...} says
where the next step starts; because the order is a function of (seed, epoch) it needs no
RNG state, and resuming from it reproduces the uninterrupted run exactly.

Shape legend: B sequences in a micro-batch, T tokens per padded sequence.
Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
from dataclasses import dataclass, field

from . import demo

PROMPT_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides "
    "further context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")


class DataError(ValueError):
    """The dataset as a whole cannot be used (not JSON, not a list, no valid record)."""


# -- loading --------------------------------------------------------------------------

def load_records(source, name: str | None = None) -> list:
    """Raw records from an Alpaca JSON list or JSONL.

    source: a path (str or os.PathLike, or an importlib Traversable), bytes, JSON text
    (a str that starts with '[' or '{'), or an already-parsed list. "demo" is the
    dataset shipped in bitlora.demo. Returns a list whose items are dicts as read, or,
    for a JSONL line that is not valid JSON, an `_Unreadable(reason)` placeholder that
    Dataset reports by index. Raises DataError for input that is not a dataset at all.
    """
    if isinstance(source, list):
        return source
    if isinstance(source, str) and source == "demo":
        source = demo.DATASET
    if isinstance(source, (bytes, bytearray, memoryview)):
        text = _decode(bytes(source), name or "data")
    elif isinstance(source, str) and source.lstrip()[:1] in ("[", "{"):
        text = source
    elif isinstance(source, (str, os.PathLike)) or hasattr(source, "read_bytes"):
        name = name or str(source)
        try:
            raw = source.read_bytes() if hasattr(source, "read_bytes") else open(source, "rb").read()
        except OSError as e:
            raise DataError(f"{name}: cannot read: {e}") from None
        text = _decode(raw, name)
    else:
        raise DataError(f"data: expected a path, bytes, text or a list, got {type(source).__name__}")
    return parse_records(text, name or "data", jsonl=str(name or "").endswith(".jsonl"))


MAX_DEPTH = 100   # Alpaca records nest 2 deep; json.loads recurses once a level
_DEEP = re.compile(r'(?:[\[{]\s*(?:"[^"\\]{0,200}"\s*:\s*)?){%d}' % MAX_DEPTH)


def parse_records(text: str, name: str = "data", jsonl: bool = False) -> list:
    """Records from the text of a JSON list or of JSONL (one object per non-blank line)."""
    head = text.lstrip()[:1]
    if not head:
        raise DataError(f"{name}: empty file")
    if _DEEP.search(text):   # in the browser a deep parse overflows the JS stack and kills Pyodide
        raise DataError(f"{name}: not JSON records: arrays or objects nested {MAX_DEPTH} deep or more")
    if not jsonl and head != "{":
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as e:   # RecursionError: absurd nesting
            raise DataError(f"{name}: not JSON: {e}") from None
        if not isinstance(data, list):
            raise DataError(f"{name}: expected a JSON list of records (or JSONL), "
                            f"got a JSON {type(data).__name__}")
        return data
    # lines end at "\n", "\r\n" or "\r" only (raw in JSON text they are whitespace, never
    # inside a string): str.splitlines also breaks at U+2028, U+2029, U+0085, ..., which JSON
    # allows raw inside a string (json.dumps(ensure_ascii=False) writes them so)
    lines = [ln for ln in text.replace("\r\n", "\n").replace("\r", "\n").split("\n") if ln.strip()]
    if not jsonl and len(lines) > 1:
        try:   # a pretty-printed object is JSON, not JSONL: say so rather than report every line
            data = json.loads(text)
        except (ValueError, RecursionError):
            pass
        else:
            raise DataError(f"{name}: expected a JSON list of records (or JSONL), got a JSON object")
    records = []
    for ln in lines:
        try:
            records.append(json.loads(ln))
        except (ValueError, RecursionError) as e:
            records.append(_Unreadable(f"invalid JSON line: {e}"))
    return records


@dataclass(frozen=True)
class _Unreadable:
    reason: str


def _decode(raw: bytes, name: str) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{name}: not UTF-8 text: {e}") from None


# -- one record ------------------------------------------------------------------------

def text_problem(s: str) -> str | None:
    """Why `s` is not text a tokenizer can take, or None: a lone UTF-16 surrogate (half an
    emoji: JSON's "\\ud83d" alone) has no UTF-8 form."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"holds a lone surrogate {s[e.start]!r} at {e.start} (half of a character, e.g. an emoji cut in two)"
    return None


def check_record(record) -> str | None:
    """None if the record is usable, else the reason it is not."""
    if isinstance(record, _Unreadable):
        return record.reason
    if not isinstance(record, dict):
        return f"expected an object, got {type(record).__name__}"
    for key in ("instruction", "output"):
        if key not in record:
            return f"missing field {key!r}"
        if not isinstance(record[key], str):
            return f"field {key!r} is {type(record[key]).__name__}, expected a string"
    inp = record.get("input")
    if inp is not None and not isinstance(inp, str):
        return f"field 'input' is {type(inp).__name__}, expected a string"
    for key in ("instruction", "input", "output"):
        bad = text_problem(record.get(key) or "")
        if bad:
            return f"field {key!r} {bad}"
    return None


def format_prompt(record: dict, with_output: bool = False) -> str:
    """The Alpaca prompt of a record, plus its output if asked."""
    inp = record.get("input") or ""
    if inp:
        text = PROMPT_INPUT.format(instruction=record["instruction"], input=inp)
    else:
        text = PROMPT_NO_INPUT.format(instruction=record["instruction"])
    return text + record["output"] if with_output else text


def _bos_cut(tok, text: str, cutoff_len: int) -> list:
    ids = ([tok.bos_id] if tok.bos_id is not None else []) + list(tok.encode(text, add_special_tokens=False))
    return ids[:cutoff_len]


def tokenize_record(tok, record: dict, cutoff_len: int, train_on_inputs: bool) -> tuple:
    """(ids[T], mask[T]) of one valid record, as alpaca-lora (see the module docstring).

    tok: anything with encode(text, add_special_tokens=False) -> list[int], bos_id, eos_id.
    """
    ids = _bos_cut(tok, format_prompt(record, with_output=True), cutoff_len)
    if ids and ids[-1] != tok.eos_id and len(ids) < cutoff_len:
        ids.append(tok.eos_id)
    n_prompt = 0 if train_on_inputs else len(_bos_cut(tok, format_prompt(record), cutoff_len))
    mask = [0 if t == 0 or t < n_prompt else 1 for t in range(len(ids))]
    return ids, mask


# -- batches and steps -------------------------------------------------------------------

@dataclass
class MicroBatch:
    """B right-padded sequences. ids[B*T], mask[B*T] row-major; lengths[B] before padding;
    indices[B] the records' positions in the input file."""
    B: int
    T: int
    ids: list
    mask: list
    lengths: list
    indices: list
    n_targets: int           # sum(mask)

    def rows(self) -> list:
        """ids as B lists of T tokens."""
        return [self.ids[b * self.T:(b + 1) * self.T] for b in range(self.B)]

    @property
    def targets(self) -> list:
        """targets[B*T]: the token position t must predict (ids[t+1]), or -1 if none."""
        T, out = self.T, []
        for b in range(self.B):
            row, m = self.ids[b * T:(b + 1) * T], self.mask[b * T:(b + 1) * T]
            out.extend(row[t + 1] if m[t + 1] else -1 for t in range(T - 1))
            out.append(-1)
        return out


@dataclass
class Step:
    """One optimizer step: its micro-batches and where the next step starts."""
    index: int               # 0-based optimizer step (the schedule's `step`)
    epoch: int
    micro_batches: list      # list[MicroBatch], 1..grad_accum of them
    n_targets: int           # target tokens in the whole step: the loss divides by this
    cursor: dict             # where the NEXT step starts: {"epoch", "micro_batch", "step",
                             #   "data" (fingerprint), "layout"}; JSON-able


@dataclass
class Dataset:
    """Tokenized valid records plus the report of skipped ones.

    examples: list of (index, ids, mask); invalid: list of (index, reason)."""
    records: list
    tok: object
    cutoff_len: int = 256
    train_on_inputs: bool = False
    vocab_size: int | None = None   # the model's: an example with an id at or past it is skipped
    examples: list = field(init=False)
    invalid: list = field(init=False)
    _fingerprint: str | None = field(init=False, default=None, repr=False, compare=False)

    def __post_init__(self):
        if getattr(self.tok, "eos_id", None) is None:
            raise DataError("the model's tokenizer names no end-of-sequence token (tokenizer_config.json's "
                            "eos_token, config.json's eos_token_id, or the GGUF's tokenizer.ggml.eos_token_id): "
                            "every training example ends with one")
        self.examples, self.invalid = [], []
        for i, rec in enumerate(self.records):
            why = check_record(rec)
            if why is None:
                ids, mask = tokenize_record(self.tok, rec, self.cutoff_len, self.train_on_inputs)
                if not any(mask):
                    why = f"no target token left within cutoff_len {self.cutoff_len}"
                elif self.vocab_size is not None and max(ids) >= self.vocab_size:
                    why = (f"token id {max(ids)} is outside the model's vocabulary ({self.vocab_size}): "
                           "its tokenizer has more tokens than its embedding")
            if why is None:
                self.examples.append((i, ids, mask))
            else:
                self.invalid.append((i, why))
        if not self.examples:
            first = f" (first: record {self.invalid[0][0]}: {self.invalid[0][1]})" if self.invalid else ""
            raise DataError(f"no usable record among {len(self.records)}{first}")

    def __len__(self) -> int:
        return len(self.examples)

    def max_len(self) -> int:
        """Tokens of the longest example: the most a micro-batch pads to."""
        return max(len(ids) for _, ids, _ in self.examples)

    def shortest_cutoff(self) -> int:
        """The shortest cutoff that keeps every example's prompt and one answer token."""
        return max(mask.index(1) + 1 for _, _, mask in self.examples)

    @property
    def pad_id(self) -> int:
        pad = getattr(self.tok, "pad_id", None)
        return self.tok.eos_id if pad is None else pad

    def fingerprint(self) -> str:
        """sha256 of the tokenized examples; a resumed run checks it against the cursor's."""
        if self._fingerprint is not None:
            return self._fingerprint
        h = hashlib.sha256()
        for i, ids, mask in self.examples:
            h.update(json.dumps([i, ids, mask], separators=(",", ":")).encode())
        self._fingerprint = h.hexdigest()
        return self._fingerprint

    # -- order -----------------------------------------------------------------------

    def order(self, epoch: int, seed: int, shuffle: bool = True) -> list:
        """Positions into self.examples in the order epoch `epoch` visits them."""
        order = list(range(len(self.examples)))
        if shuffle:
            random.Random(f"bitlora-data:{seed}:{epoch}").shuffle(order)
        return order

    def micro_batches_per_epoch(self, micro_batch_size: int) -> int:
        return -(-len(self.examples) // micro_batch_size)

    def steps_per_epoch(self, micro_batch_size: int, grad_accum: int) -> int:
        return -(-self.micro_batches_per_epoch(micro_batch_size) // grad_accum)

    def total_steps(self, micro_batch_size: int, grad_accum: int, epochs: int, max_steps: int = 0) -> int:
        """Optimizer steps of the whole run (the schedules' total): max_steps if > 0."""
        return max_steps if max_steps > 0 else epochs * self.steps_per_epoch(micro_batch_size, grad_accum)

    def micro_batch(self, positions: list) -> MicroBatch:
        """Pad the examples at `positions` into one MicroBatch."""
        rows = [self.examples[p] for p in positions]
        T = max(len(ids) for _, ids, _ in rows)
        ids, mask = [], []
        for _, r_ids, r_mask in rows:
            pad = T - len(r_ids)
            ids += r_ids + [self.pad_id] * pad
            mask += r_mask + [0] * pad
        return MicroBatch(B=len(rows), T=T, ids=ids, mask=mask, lengths=[len(r[1]) for r in rows],
                          indices=[r[0] for r in rows], n_targets=sum(mask))

    def batches(self, epoch: int, micro_batch_size: int, seed: int = 42, shuffle: bool = True):
        """The micro-batches of one epoch, in order (what steps() groups)."""
        order = self.order(epoch, seed, shuffle)
        for a in range(0, len(order), micro_batch_size):
            yield self.micro_batch(order[a:a + micro_batch_size])

    def steps(self, micro_batch_size: int, grad_accum: int, epochs: int, seed: int = 42,
              shuffle: bool = True, max_steps: int = 0, cursor: dict | None = None):
        """Yield Step after Step from `cursor` (default: the start) to the end of the run:
        `epochs` epochs, or exactly `max_steps` steps if > 0 (cycling through epochs).

        A cursor also records the dataset's fingerprint and the batching (micro-batch
        size, accumulation, seed, shuffle); resuming with different ones is a DataError,
        since the continued run would not be the uninterrupted one."""
        total = self.total_steps(micro_batch_size, grad_accum, epochs, max_steps)
        per_epoch = self.micro_batches_per_epoch(micro_batch_size)
        layout = [micro_batch_size, grad_accum, seed, bool(shuffle)]
        fp = self.fingerprint()[:16]
        if cursor:
            for key, want, what in (("data", fp, "the dataset (or cutoff_len / train_on_inputs)"),
                                    ("layout", layout, "micro_batch_size, grad_accum, seed or shuffle")):
                if key in cursor and cursor[key] != want:
                    raise DataError(f"resume: {what} differs from the checkpoint's")
        epoch, mb, step = (cursor["epoch"], cursor["micro_batch"], cursor["step"]) if cursor else (0, 0, 0)
        order_epoch, order = None, None
        while step < total:
            if order_epoch != epoch:
                order_epoch, order = epoch, self.order(epoch, seed, shuffle)
            batches = []
            while len(batches) < grad_accum and mb < per_epoch:
                batches.append(self.micro_batch(order[mb * micro_batch_size:(mb + 1) * micro_batch_size]))
                mb += 1
            this_epoch = epoch
            if mb == per_epoch:
                epoch, mb = epoch + 1, 0
            step += 1
            yield Step(index=step - 1, epoch=this_epoch, micro_batches=batches,
                       n_targets=sum(b.n_targets for b in batches),
                       cursor={"epoch": epoch, "micro_batch": mb, "step": step, "data": fp, "layout": layout})

    def steps_for(self, cfg, cursor: dict | None = None):
        """steps() with a TrainConfig's micro_batch_size, grad_accum, epochs, seed,
        shuffle and max_steps."""
        return self.steps(cfg.micro_batch_size, cfg.grad_accum, cfg.epochs, seed=cfg.seed,
                          shuffle=cfg.shuffle, max_steps=cfg.max_steps, cursor=cursor)

    def total_steps_for(self, cfg) -> int:
        return self.total_steps(cfg.micro_batch_size, cfg.grad_accum, cfg.epochs, cfg.max_steps)


def dataset_for(cfg, tok, source=None) -> Dataset:
    """The Dataset of a TrainConfig: records from `source` (default cfg.data), tokenized
    with its cutoff_len and train_on_inputs."""
    return Dataset(load_records(cfg.data if source is None else source), tok,
                   cutoff_len=cfg.cutoff_len, train_on_inputs=cfg.train_on_inputs)
