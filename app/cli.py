"""The `bitlora` command line.

    bitlora serve [--host 127.0.0.1] [--port 8765]   the web app, Pyodide and the wheel
    bitlora lite                                      build the JupyterLite site that serve shows at /lite/
    bitlora train [--model M] [--data D] [--out DIR] ...  LoRA finetuning (alpaca-lora flags)
    bitlora bench optim --params N                    optimizer step benchmark (native)
    bitlora bench train --shape 2b4t                  LoRA training tokens/s and GPU memory (native)
    bitlora bench generate --shape 2b4t               greedy generation tokens/s (native)
    bitlora info                                      the native GPU adapter and its limits
"""
from __future__ import annotations

import argparse
import json
import sys


def cmd_serve(args) -> int:
    from .server import MissingAssets, Server

    try:
        server = Server(host=args.host, port=args.port, quiet=args.quiet, allow_origins=args.allow_origin)
    except (MissingAssets, ValueError) as e:
        print(f"bitlora serve: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"bitlora serve: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"bitlora: serving the app at {server.url}  (Ctrl+C to stop)", flush=True)
    if (server.lite_dir / "index.html").exists():
        print(f"bitlora: notebooks (JupyterLite) at {server.url}lite/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
    return 0


def cmd_lite(args) -> int:
    from .lite import LiteError, build_site

    try:
        out = build_site()
    except LiteError as e:
        print(f"bitlora lite: {e}", file=sys.stderr)
        return 2
    print(f"bitlora lite: built the JupyterLite site in {out}; `bitlora serve` shows it at "
          "http://127.0.0.1:8765/lite/")
    return 0


def resumed_settings(ckpt) -> dict:
    """What a --resume run takes from its checkpoint where no flag says otherwise: every
    setting of the run that saved it but where to write and which backend (and the model
    and data, where the page made it: they were files in the browser)."""
    from bitlora.formats.state import load_config

    saved = load_config(ckpt)
    return {k: v for k, v in saved.items() if k not in ("out", "backend", "resume", "init_adapter")
            and not (k in ("model", "data") and v == "browser")}


def init_adapter_settings(args, cfg) -> None:
    """--init-adapter fixes the adapter's rank, alpha and modules: take them into `cfg`
    (the memory estimate and the saved config say what will train), and refuse flags
    that contradict them, or --resume beside it (a checkpoint brings its own adapter)."""
    from bitlora.config import ConfigError
    from bitlora.formats import peft

    if args.resume:
        raise ConfigError("--init-adapter and --resume: a resumed run continues its checkpoint's adapter; "
                          "give one of them")
    conf, tensors = peft.load_adapter(cfg.init_adapter)
    fixed = peft.adapter_settings(conf, tensors)
    for name in ("lora_r", "lora_alpha", "target_modules"):
        if getattr(args, name, None) is not None and getattr(cfg, name) != fixed[name]:
            shown = ",".join(fixed[name]) if name == "target_modules" else fixed[name]
            raise ConfigError(f"--{name.replace('_', '-')} contradicts --init-adapter {cfg.init_adapter}, "
                              f"whose adapter has {name} {shown}: drop the flag (or start without the adapter)")
        setattr(cfg, name, fixed[name])


def cmd_train(args) -> int:
    from bitlora.config import ConfigError, TrainConfig
    from bitlora.formats.errors import FormatError

    try:
        cfg = TrainConfig.from_cli(args, resumed_settings(args.resume) if args.resume else None)
        if cfg.init_adapter:
            init_adapter_settings(args, cfg)
    except (ConfigError, ValueError, FormatError) as e:
        print(f"bitlora train: {e}", file=sys.stderr)
        return 2
    if cfg.backend == "browser":
        from .train_browser import train_in_browser
        return train_in_browser(cfg)
    from .train_native import train_native
    return train_native(cfg)


def cmd_info(args) -> int:
    from bitlora import gpu

    dev = gpu.run(gpu.get_device("native"))
    print(json.dumps({"adapter": dev.adapter_info, "limits": dev.limits}, indent=2))
    return 0


def cmd_bench(args) -> int:
    try:
        if args.what == "train":
            from bitlora.bench.train import main_train as main
        elif args.what == "generate":
            from bitlora.bench.generate import main_generate as main
        else:
            from bitlora.bench.optim import main_optim as main
    except ImportError as e:
        print(f"bitlora bench: benchmarks unavailable ({e})", file=sys.stderr)
        return 2
    from bitlora.config import ConfigError
    from bitlora.formats.errors import FormatError
    try:
        main(args)
    except (ConfigError, FormatError, ValueError) as e:   # settings the model or the bench refuses
        print(f"bitlora bench {args.what}: {e}", file=sys.stderr)
        return 2
    return 0


def port(text: str) -> int:
    """A TCP port for argparse: 0 (any free one) to 65535."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"{n} is not a TCP port (0-65535)")
    return n


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bitlora", description="LoRA finetuning of BitNet b1.58 on WebGPU.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="serve the web app on this machine")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    s.add_argument("--port", type=port, default=8765, help="TCP port (0 picks a free one; default 8765)")
    s.add_argument("--quiet", action="store_true", help="do not log requests")
    s.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="an origin (https://host[:port]) the page may fetch datasets and models from, "
                        "besides this server and the Hugging Face Hub; repeatable")
    s.set_defaults(func=cmd_serve)

    s = sub.add_parser("lite", help="build the JupyterLite site (notebooks with a Pyodide kernel) "
                                    "that `bitlora serve` shows at /lite/",
                       description="Build build/lite: JupyterLite with the Pyodide kernel and examples/*.ipynb, "
                                   "set up to use this server's Pyodide and bitlora wheel (no CDN).")
    s.set_defaults(func=cmd_lite)

    s = sub.add_parser("train", help="LoRA-finetune a BitNet model on Alpaca-format data",
                       description="LoRA finetuning with alpaca-lora-style flags. Defaults: the built-in "
                                   "demo model and dataset. Writes OUT/adapter_config.json, "
                                   "OUT/adapter_model.safetensors and OUT/metrics.jsonl.")
    from bitlora.config import TrainConfig
    TrainConfig.add_cli_args(s)
    s.set_defaults(func=cmd_train)

    s = sub.add_parser("info", help="show the native GPU adapter and its limits")
    s.set_defaults(func=cmd_info)

    s = sub.add_parser("bench", help="benchmarks that print figures")
    bsub = s.add_subparsers(dest="what", required=True)
    b = bsub.add_parser("optim", help="one fused optimizer step (norm, clip, scale, AdamW, zeroing) "
                                      "beside torch clip_grad_norm_ + fused AdamW where CUDA is present")
    from bitlora.bench.optim import add_optim_args
    add_optim_args(b)
    b.set_defaults(func=cmd_bench)
    b = bsub.add_parser("train", help="LoRA training steps on random weights of a model's shapes: trained "
                                      "tokens/s and GPU memory, beside torch + PEFT where CUDA is present")
    from bitlora.bench.train import add_train_args
    add_train_args(b)
    b.set_defaults(func=cmd_bench)
    b = bsub.add_parser("generate", help="greedy generation on random weights of a model's shapes (or a model): "
                                         "prompt and decoding tokens/s, beside transformers + torch where CUDA is present")
    from bitlora.bench.generate import add_generate_args
    add_generate_args(b)
    b.set_defaults(func=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    import asyncio

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (KeyboardInterrupt, asyncio.CancelledError):   # Ctrl+C before a command's own handling
        print(f"\nbitlora {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
