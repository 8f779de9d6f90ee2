"""Write the built-in demo dataset, py/bitlora/demo/alpaca_demo.json.

An ORIGINAL Alpaca-format dataset ({instruction, input, output} records), made
here from templates and small word lists written for this project; nothing is
copied from Stanford Alpaca or any other dataset. Dedicated to the public domain
(CC0 1.0). The tasks are ones a tiny model can visibly learn in a few dozen LoRA
steps: uppercase a word, reverse a short list, sort a few numbers, add two small
numbers, give an opposite, count letters, repeat a phrase, even or odd, first
letter. Deterministic: the same seed gives the same file, byte for byte.

The word lists and the `fact()` sentences are also used by
scripts/make_demo_model.py to pretrain the demo model on the same skills in a
plain-sentence format, so that LoRA only has to learn the Alpaca format.

    python scripts/make_demo_data.py [--seed 0] [--per-task 40] [--out PATH]

Standard library only.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import random

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "py" / "bitlora" / "demo" / "alpaca_demo.json"

# Small word lists, written for this project.
ANIMALS = ["cat", "dog", "fox", "owl", "bee", "cow", "pig", "hen", "ant", "bat",
           "frog", "duck", "goat", "lion", "wolf", "bear", "fish", "crab", "deer", "mole",
           "horse", "mouse", "sheep", "tiger", "zebra", "snake", "eagle", "whale", "camel", "otter"]
FRUITS = ["apple", "pear", "plum", "fig", "lime", "kiwi", "mango", "grape", "lemon", "peach",
          "melon", "cherry", "banana", "orange", "berry", "date"]
COLOURS = ["red", "blue", "green", "pink", "gold", "gray", "black", "white", "brown", "purple"]
THINGS = ["cup", "box", "hat", "pen", "map", "key", "bell", "book", "lamp", "door",
          "boat", "kite", "ring", "sock", "desk", "chair", "clock", "spoon", "train", "stone"]
WORDS = ANIMALS + FRUITS + COLOURS + THINGS
OPPOSITES = [("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"),
             ("happy", "sad"), ("light", "dark"), ("open", "shut"), ("early", "late"),
             ("wet", "dry"), ("hard", "soft"), ("full", "empty"), ("old", "new"),
             ("long", "short"), ("high", "low"), ("loud", "quiet"), ("strong", "weak"),
             ("near", "far"), ("in", "out"), ("day", "night"), ("yes", "no"),
             ("push", "pull"), ("win", "lose"), ("first", "last"), ("top", "bottom"),
             ("left", "right"), ("buy", "sell"), ("give", "take"), ("before", "after"),
             ("thick", "thin"), ("rich", "poor"), ("clean", "dirty"), ("good", "bad")]
OPPOSITE = dict(OPPOSITES + [(b, a) for a, b in OPPOSITES])
PHRASES = ["hello", "good day", "thank you", "see you soon", "well done", "go team",
           "red boat", "blue sky", "happy cat", "one more time", "so long", "all good"]
TIMES = {2: "two", 3: "three", 4: "four"}
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


# Each task returns (instruction, input, output); `rng` picks the instance and,
# for most tasks, whether the instance goes in the input field or the instruction.
def uppercase(rng):
    w = rng.choice(WORDS)
    if rng.random() < 0.5:
        return rng.choice(["Write this word in capital letters.", "Change the word to upper case."]), w, w.upper()
    return f"Write the word {w} in capital letters.", "", w.upper()


def reverse_list(rng):
    ws = rng.sample(WORDS, rng.randint(3, 4))
    return (rng.choice(["Reverse the order of these words.", "List these words backwards."]),
            ", ".join(ws), ", ".join(reversed(ws)))


def sort_numbers(rng):
    ns = rng.sample(range(1, 30), rng.randint(3, 5))
    return (rng.choice(["Sort these numbers from smallest to largest.", "Put the numbers in increasing order."]),
            " ".join(map(str, ns)), " ".join(map(str, sorted(ns))))


def add(rng):
    a, b = rng.randint(0, 12), rng.randint(0, 12)
    if rng.random() < 0.5:
        return "Add the two numbers.", f"{a} and {b}", str(a + b)
    return f"What is {a} plus {b}?", "", str(a + b)


def opposite(rng):
    w = rng.choice(sorted(OPPOSITE))
    if rng.random() < 0.5:
        return "Give the opposite of this word.", w, OPPOSITE[w]
    return f"What is the opposite of {w}?", "", OPPOSITE[w]


def count_letters(rng):
    w = rng.choice(WORDS)
    if rng.random() < 0.5:
        return "How many letters are in this word?", w, str(len(w))
    return f"Count the letters in the word {w}.", "", str(len(w))


def repeat(rng):
    p, n = rng.choice(PHRASES), rng.choice(sorted(TIMES))
    if rng.random() < 0.5:
        return f"Repeat the phrase {TIMES[n]} times.", p, " ".join([p] * n)
    return f"Say \"{p}\" {TIMES[n]} times.", "", " ".join([p] * n)


def even_odd(rng):
    n = rng.randint(0, 99)
    ans = "even" if n % 2 == 0 else "odd"
    if rng.random() < 0.5:
        return "Is this number even or odd?", str(n), ans
    return f"Is {n} even or odd?", "", ans


def first_letter(rng):
    w = rng.choice(WORDS)
    if rng.random() < 0.5:
        return "What is the first letter of this word?", w, w[0]
    return f"Give the first letter of the word {w}.", "", w[0]


TASKS = [uppercase, reverse_list, sort_numbers, add, opposite, count_letters, repeat, even_odd, first_letter]


def make_records(seed: int = 0, per_task: int = 40) -> list[dict]:
    """`per_task` distinct records of each task, shuffled; deterministic in `seed`."""
    rng = random.Random(seed)
    records, seen = [], set()
    for task in TASKS:
        n, tries = 0, 0
        while n < per_task and tries < 100 * per_task:
            tries += 1
            ins, inp, out = task(rng)
            if (ins, inp) in seen:
                continue
            seen.add((ins, inp))
            records.append({"instruction": ins, "input": inp, "output": out})
            n += 1
    rng.shuffle(records)
    return records


def fact(rng: random.Random) -> tuple[str, str, str]:
    """One plain sentence stating a fact of one of the tasks' skills, in a format
    unlike the Alpaca prompt, as (prefix, answer, suffix); the sentence is their
    concatenation. Used to pretrain and probe the demo model (make_demo_model.py)."""
    k = rng.randrange(10)
    w = rng.choice(WORDS)
    if k == 0:
        return f"{w} in {rng.choice(['capitals', 'capital letters', 'upper case'])} is ", w.upper(), "."
    if k == 1:
        ws = rng.sample(WORDS, rng.randint(2, 5))
        return f"{', '.join(ws)} backwards is ", ", ".join(reversed(ws)), "."
    if k == 2:
        ns = rng.sample(range(1, 30), rng.randint(2, 5))
        return f"{' '.join(map(str, ns))} sorted is ", " ".join(map(str, sorted(ns))), "."
    if k == 3:
        a, b = rng.randint(0, 12), rng.randint(0, 12)
        return rng.choice([f"{a} + {b} = ", f"{a} plus {b} makes "]), str(a + b), "."
    if k == 4:
        o = rng.choice(sorted(OPPOSITE))
        return f"the opposite of {o} is ", OPPOSITE[o], "."
    if k == 5:
        return f"the word {w} has ", str(len(w)), " letters."
    if k == 6:
        p, n = rng.choice(PHRASES), rng.choice(sorted(TIMES))
        return f"{p} said {TIMES[n]} times is ", " ".join([p] * n), "."
    if k == 7:
        n = rng.randint(0, 99)
        return f"{n} is ", "even" if n % 2 == 0 else "odd", "."
    if k == 8:
        return f"the word {w} starts with ", w[0], "."
    a, c, t = rng.choice(ANIMALS), rng.choice(COLOURS), rng.choice(THINGS + FRUITS)
    return rng.choice([(f"the {c} {a} has a ", t, "."), (f"a {a} sees the {c} ", t, "."),
                       (f"the {a} likes the ", t, "."),
                       (f"{NUMBER_WORDS[rng.randint(2, 10)]} {a}s sit by the ", t, ".")])


def facts(rng: random.Random) -> str:
    """One fact sentence (see `fact`)."""
    return "".join(fact(rng))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-task", type=int, default=40)
    ap.add_argument("--out", type=pathlib.Path, default=OUT)
    args = ap.parse_args()
    records = make_records(args.seed, args.per_task)
    args.out.write_text(json.dumps(records, indent=1) + "\n")
    with_input = sum(1 for r in records if r["input"])
    print(f"wrote {len(records)} records ({with_input} with input) to {args.out}")


if __name__ == "__main__":
    main()
