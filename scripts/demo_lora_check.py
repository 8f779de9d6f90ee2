"""Check that the demo model visibly learns the demo dataset with LoRA (PEFT, CPU).

Native-only development check (torch, transformers, peft): the Alpaca recipe of
REFERENCE.md (prompt masked, [bos] + prompt + output + [eos]), LoRA r 8, alpha 16,
q_proj and v_proj, AdamW; prints the loss curve and a few greedy answers before
and after. It is what the WebGPU trainer should reproduce on the demo.

    python scripts/demo_lora_check.py [--model DIR] [--steps 150] [--lr 2e-3]
"""
from __future__ import annotations

import os

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEMO = ROOT / "py" / "bitlora" / "demo"
PROMPT_INPUT = ("Below is an instruction that describes a task, paired with an input that provides "
                "further context. Write a response that appropriately completes the request.\n\n"
                "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
PROMPT_NO_INPUT = ("Below is an instruction that describes a task. Write a response that "
                   "appropriately completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")


def prompt(r: dict) -> str:
    return (PROMPT_INPUT if r["input"] else PROMPT_NO_INPUT).format(**r)


def example(tok, r: dict, cutoff: int = 256) -> tuple[list[int], list[int]]:
    """Alpaca recipe: ids = [bos] + enc(prompt + output) + [eos]; prompt labels = -100."""
    p = tok(prompt(r), add_special_tokens=False)["input_ids"]
    ids = ([tok.bos_token_id] + tok(prompt(r) + r["output"], add_special_tokens=False)["input_ids"]
           + [tok.eos_token_id])[:cutoff]
    labels = [-100] * (1 + len(p)) + ids[1 + len(p):]
    return ids, labels[:len(ids)]


@torch.no_grad()
def answer(model, tok, r: dict) -> str:
    ids = torch.tensor([[tok.bos_token_id] + tok(prompt(r), add_special_tokens=False)["input_ids"]])
    out = model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.eos_token_id)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=pathlib.Path, default=DEMO / "model")
    ap.add_argument("--data", type=pathlib.Path, default=DEMO / "alpaca_demo.json")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    records = json.loads(args.data.read_text())
    shown = records[:4]
    before = [answer(model, tok, r) for r in shown]
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                             target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    rng, losses, t0 = random.Random(0), [], time.time()
    model.train()
    for step in range(args.steps):
        batch = [example(tok, r) for r in rng.sample(records, args.batch)]
        T = max(len(ids) for ids, _ in batch)
        x = torch.tensor([ids + [tok.eos_token_id] * (T - len(ids)) for ids, _ in batch])
        y = torch.tensor([lab + [-100] * (T - len(lab)) for _, lab in batch])
        att = torch.tensor([[1] * len(ids) + [0] * (T - len(ids)) for ids, _ in batch])
        loss = model(input_ids=x, attention_mask=att, labels=y).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == args.steps - 1:
            print(f"lora step {step:4d} loss {loss.item():.4f} {time.time() - t0:6.1f}s", flush=True)
    model.eval()
    after = [answer(model, tok, r) for r in shown]
    for r, b, a in zip(shown, before, after):
        print(f"{r['instruction']!r} {r['input']!r}: want {r['output']!r} | before {b!r} | after {a!r}")
    hits = sum(answer(model, tok, r).strip() == r["output"] for r in records[:60])
    print(json.dumps({"first_loss": losses[0], "last10_mean": sum(losses[-10:]) / 10,
                      "exact_after_on_60_train_records": hits}))


if __name__ == "__main__":
    main()
