"""bitlora.bench: benchmarks, native only (numpy; torch where a CUDA GPU is there to
compare). Installed as a package beside the library but left out of the wheel the
browser gets.

    bitlora bench optim --params N          # optim.py: the fused optimizer step
    bitlora bench train --shape 2b4t        # train.py: LoRA training tokens/s + GPU memory
    python -m bitlora.bench.forward         # forward.py: prefill + KV-cache decoding
    python -m bitlora.bench.backward        # backward.py: each backward kernel
    python -m bitlora.bench.matmul          # matmul.py: ternary matmuls, split-K variants
    python -m bitlora.bench.attention       # attention.py: attention backward vs numpy
"""


def count(text: str) -> int:
    """An argparse type for the benchmarks' counts (steps, tokens, ranks, repeats): >= 1."""
    import argparse
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n
