"""Make the built-in demo model, py/bitlora/demo/model/ (a Hugging Face folder).

Native-only development script (torch, transformers, tokenizers); nothing in the
package imports it. Three steps, all deterministic from --seed:

1. Tokenizer: a byte-level BPE (HF `tokenizers`) with LLaMA-3 conventions: the
   LLaMA-3 split regex, then GPT-2 byte-to-unicode mapping; special tokens
   <|begin_of_text|> (bos, id 0) and <|end_of_text|> (eos, id 1); bos is added by
   the post-processor. Trained on generated text, the Alpaca preambles included
   (so prompts are short in tokens; knowing the words is not knowing the format).
2. Model: a transformers `BitNetForCausalLM` (C 128, F 384, L 4, H 4, Hkv 2, D 32,
   tied embeddings, RoPE theta 10000, 512 positions) whose projections are HF's
   `AutoBitLinear` in online mode: every forward ternarises the weights
   (s_w = 1/mean|W|) and 8-bit-quantises the activations per token, and backward is
   the straight-through estimator -- quantisation-aware training, exactly the layers
   transformers builds when it loads the saved folder (`quantization_config`
   {quant_method bitnet, linear_class autobitlinear, quantization_mode online}).
   C, F are multiples of 128 so every projection row is whole I2_S blocks.
3. Pretraining on CPU (2 threads) on plain sentences stating the demo tasks'
   facts ("apple in capitals is APPLE.", "the opposite of hot is cold.") -- never in
   the Alpaca prompt format, so LoRA on alpaca_demo.json visibly learns the format.

Saves config.json, model.safetensors (f32 master weights), generation_config.json,
tokenizer.json, tokenizer_config.json (about 3.7 MB in all). With the defaults
(2000 steps of 16 x 128 tokens, AdamW lr 4e-3 cosine, seed 0) training takes about
6.5 min on two free CPU threads and ends near loss 1.07; the committed folder came
from exactly this command (torch 2.11 there; a rerun elsewhere may differ in the
last bits). On a busy machine expect several times longer.

    python scripts/make_demo_model.py [--steps 2000] [--out DIR]
"""
from __future__ import annotations

import os

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # HF's quantisers are @torch.compile'd; eager is fine here

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import make_demo_data  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "py" / "bitlora" / "demo" / "model"

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PROMPT_INPUT = ("Below is an instruction that describes a task, paired with an input that provides "
                "further context. Write a response that appropriately completes the request.\n\n"
                "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
PROMPT_NO_INPUT = ("Below is an instruction that describes a task. Write a response that "
                   "appropriately completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")

QUANT = {"quant_method": "bitnet", "linear_class": "autobitlinear", "quantization_mode": "online",
         "use_rms_norm": False, "rms_norm_eps": 1e-6, "modules_to_not_convert": None}
ARCH = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5,
            tie_word_embeddings=True, hidden_act="relu2", initializer_range=0.02,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def alpaca_text(r: dict) -> str:
    return (PROMPT_INPUT if r["input"] else PROMPT_NO_INPUT).format(**r) + r["output"]


def document(rng: random.Random) -> str:
    """A pretraining document: 4..12 plain fact sentences, one per line."""
    return "\n".join(make_demo_data.facts(rng) for _ in range(rng.randint(4, 12)))


def make_tokenizer(seed: int, vocab_size: int) -> Tokenizer:
    rng = random.Random(seed)
    texts = [document(rng) for _ in range(3000)]
    texts += [alpaca_text(r) for r in make_demo_data.make_records(seed + 1, 40)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=[BOS, EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, tok.token_to_id(BOS))])
    return tok


def token_stream(tok: Tokenizer, seed: int, n_tokens: int) -> torch.Tensor:
    """Documents as [bos] + text + [eos], concatenated into one long stream."""
    rng, eos, ids = random.Random(seed), tok.token_to_id(EOS), []
    while len(ids) < n_tokens:
        ids += tok.encode(document(rng)).ids + [eos]
    return torch.tensor(ids[:n_tokens], dtype=torch.long)


def build_model(vocab_size: int, bos: int, eos: int):
    """BitNetForCausalLM whose projections are AutoBitLinear(online): the QAT form."""
    from transformers import BitNetConfig, BitNetForCausalLM
    from transformers.integrations.bitnet import AutoBitLinear
    config = BitNetConfig(vocab_size=vocab_size, bos_token_id=bos, eos_token_id=eos, pad_token_id=eos, **ARCH)
    model = BitNetForCausalLM(config)
    for name, mod in list(model.named_modules()):
        if isinstance(mod, torch.nn.Linear) and name != "lm_head":
            new = AutoBitLinear(mod.in_features, mod.out_features, bias=False, online_quant=True)
            new.weight = mod.weight
            model.set_submodule(name, new)
    model.config.quantization_config = dict(QUANT)
    return model


def train(model, stream: torch.Tensor, *, steps: int, batch: int, seq: int, lr: float, seed: int) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": other, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    warm, losses, t0 = max(1, steps // 20), [], time.time()
    model.train()
    for step in range(steps):
        f = (step + 1) / warm if step < warm else 0.5 * (1 + math.cos(math.pi * (step - warm) / (steps - warm)))
        for group in opt.param_groups:
            group["lr"] = lr * (0.05 + 0.95 * f)
        starts = torch.randint(0, len(stream) - seq - 1, (batch,), generator=g)
        x = torch.stack([stream[s:s + seq + 1] for s in starts.tolist()])
        loss = model(input_ids=x[:, :-1], labels=x[:, :-1]).loss  # HF shifts labels itself
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}  lr {opt.param_groups[0]['lr']:.2e}  "
                  f"{time.time() - t0:6.1f}s", flush=True)
    model.eval()
    return losses


@torch.no_grad()
def generate(model, tok: Tokenizer, text: str, max_new: int = 24) -> str:
    """Greedy continuation of `text` (bos added), up to eos or `max_new` tokens."""
    ids = torch.tensor([tok.encode(text).ids])
    out = model.generate(ids, max_new_tokens=max_new, do_sample=False, eos_token_id=tok.token_to_id(EOS),
                         pad_token_id=tok.token_to_id(EOS))
    return tok.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True)


def probe(model, tok: Tokenizer, seed: int, n: int = 60) -> float:
    """Share of fresh fact sentences whose answer the model completes exactly (greedy)."""
    rng, hits = random.Random(seed), 0
    for i in range(n):
        prefix, answer, suffix = make_demo_data.fact(rng)
        prefix, want = prefix.rstrip(" "), " " * prefix.endswith(" ") + answer + suffix  # " cold" is one token
        got = generate(model, tok, prefix, max_new=len(tok.encode(want).ids) + 1)
        hits += got.startswith(want)
        if i < 6:
            print(f"  probe: {prefix!r} -> {got!r}  (want {want!r})")
    return hits / n


def save(model, tok: Tokenizer, out: pathlib.Path) -> None:
    from transformers import GenerationConfig, PreTrainedTokenizerFast
    out.mkdir(parents=True, exist_ok=True)
    for p in out.iterdir():
        p.unlink()
    model.generation_config = GenerationConfig(bos_token_id=model.config.bos_token_id,
                                               eos_token_id=model.config.eos_token_id,
                                               pad_token_id=model.config.pad_token_id, do_sample=False)
    model.save_pretrained(out)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=EOS,
                                   model_max_length=ARCH["max_position_embeddings"])
    fast.save_pretrained(out)
    for extra in ("special_tokens_map.json", "chat_template.jinja"):
        if (out / extra).exists():
            (out / extra).unlink()
    # the class name every transformers version knows (5.x writes "TokenizersBackend")
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg.update(tokenizer_class="PreTrainedTokenizerFast", add_bos_token=True, add_eos_token=False)
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=4e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=pathlib.Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)

    tok = make_tokenizer(args.seed, args.vocab)
    V = tok.get_vocab_size()
    stream = token_stream(tok, args.seed + 2, 400_000)
    print(f"tokenizer: V={V}; pretraining stream {len(stream)} tokens")
    model = build_model(V, tok.token_to_id(BOS), tok.token_to_id(EOS))
    print(f"model: {sum(p.numel() for p in model.parameters())} parameters")
    t0 = time.time()
    losses = train(model, stream, steps=args.steps, batch=args.batch, seq=args.seq, lr=args.lr, seed=args.seed)
    secs = time.time() - t0
    acc = probe(model, tok, args.seed + 3)
    print(f"probe accuracy {acc:.2f}")
    save(model, tok, args.out)
    size = sum(p.stat().st_size for p in args.out.iterdir())
    tail = sum(losses[-20:]) / len(losses[-20:])
    print(json.dumps({"train_seconds": round(secs, 1), "final_loss_mean20": round(tail, 4), "probe_accuracy": acc, "vocab": V,
                      "folder_bytes": size}))


if __name__ == "__main__":
    main()
