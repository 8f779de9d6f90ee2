"""Regenerate the whole built-in demo: dataset -> model -> GGUF.

    python scripts/make_demo.py [--skip-model]

1. scripts/make_demo_data.py writes py/bitlora/demo/alpaca_demo.json (seconds);
2. scripts/make_demo_model.py trains the tokenizer and the tiny BitNet model and
   writes py/bitlora/demo/model/ (about 6-7 min on two free CPU threads; much
   longer on a busy machine; --skip-model keeps the committed folder);
3. bitlora.app.convert writes py/bitlora/demo/model.gguf from that folder.

The GGUF is I2_S (arch `bitnet-b1.58`), not TQ2_0: the demo's
width C = 128 is not a multiple of TQ2_0's 256-weight block, while I2_S needs only
whole 128-weight blocks and keeps one exact f32 scale per tensor (TQ2_0 rounds it
to f16 per block). The embedding stays f32, so the GGUF and the HF folder load to
identical tensors. Native-only (torch, transformers, numpy, gguf).
"""
from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEMO = ROOT / "py" / "bitlora" / "demo"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-model", action="store_true", help="keep the committed model folder")
    args = ap.parse_args()
    here = pathlib.Path(__file__).resolve().parent
    subprocess.run([sys.executable, str(here / "make_demo_data.py")], check=True)
    if not args.skip_model:
        subprocess.run([sys.executable, str(here / "make_demo_model.py")], check=True)
    try:
        from bitlora.app.convert import convert
    except ImportError as e:  # the converter is native-only: numpy and gguf
        sys.exit(f"GGUF step skipped: bitlora.app.convert is unavailable ({e})")
    out = convert(DEMO / "model", DEMO / "model.gguf", ttype="i2_s", arch="bitnet-b1.58", embed_type="f32")
    print(f"wrote {out} ({pathlib.Path(out).stat().st_size} bytes)")


if __name__ == "__main__":
    main()
