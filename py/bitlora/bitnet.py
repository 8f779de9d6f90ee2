"""The BitNet b1.58 vocabulary, defined once: the names of a decoder layer's
projections and norms, every tensor's shape from a config, and the configs bitlora
knows by name (BitNet b1.58 2B-4T and the demo model).

Names are Hugging Face's BitNet names (`model.layers.0.self_attn.q_proj.weight`),
whatever a file format calls them; short projection names (`q_proj`) are PEFT's
`target_modules`. Shapes use model.py's legend: C width, F FFN width, H heads,
Hkv KV heads, D head dim, V vocab, L layers. A config is a dict with HF BitNetConfig
keys (`hidden_size`, ...; `head_dim` optional).

No GPU, no file reading: the model, the LoRA code, the checkpoint readers and the
benchmarks import their names from here. Standard library only.
"""
from __future__ import annotations

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
MODULES = ATTN + MLP                   # short names, in layer order
FULL = {m: ("self_attn." if m in ATTN else "mlp.") + m for m in MODULES}   # short -> path in a layer
PROJ = tuple(FULL[m] for m in MODULES)  # the seven BitLinear projections of a layer
NORMS = ("input_layernorm", "self_attn.attn_sub_norm", "post_attention_layernorm", "mlp.ffn_sub_norm")

EMBED = "model.embed_tokens.weight"    # e[V, C]
FINAL_NORM = "model.norm.weight"       # w[C]
LM_HEAD = "lm_head.weight"             # [V, C]; absent when tie_word_embeddings


def layer_prefix(i: int) -> str:
    return f"model.layers.{i}."


def is_projection(name: str) -> bool:
    """True for a full tensor name of a BitLinear projection weight."""
    return name.endswith(".weight") and name[:-len(".weight")].endswith(PROJ)


def head_dim(config: dict) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def projection_shapes(config: dict) -> dict:
    """{short name: (O, I)} of a layer's projections: q[H*D, C], k, v[Hkv*D, C],
    o[C, H*D], gate, up[F, C], down[C, F]."""
    C, F, H = config["hidden_size"], config["intermediate_size"], config["num_attention_heads"]
    Hkv = config.get("num_key_value_heads") or H
    D = head_dim(config)
    return {"q_proj": (H * D, C), "k_proj": (Hkv * D, C), "v_proj": (Hkv * D, C), "o_proj": (C, H * D),
            "gate_proj": (F, C), "up_proj": (F, C), "down_proj": (C, F)}


def norm_sizes(config: dict) -> dict:
    """{norm path: width}: every norm is w[C] except ffn_sub_norm, w[F]."""
    C, F = config["hidden_size"], config["intermediate_size"]
    return {n: F if n == "mlp.ffn_sub_norm" else C for n in NORMS}


def tensor_shapes(config: dict) -> dict[str, tuple]:
    """Full name -> shape of every tensor of a model, in the order a layer uses them;
    lm_head only when untied."""
    proj = {FULL[m]: s for m, s in projection_shapes(config).items()}
    norms = {n: (w,) for n, w in norm_sizes(config).items()}
    layer = ["input_layernorm", *PROJ[:4], "self_attn.attn_sub_norm", "post_attention_layernorm",
             *PROJ[4:], "mlp.ffn_sub_norm"]
    V, C = config["vocab_size"], config["hidden_size"]
    out = {EMBED: (V, C)}
    for i in range(config["num_hidden_layers"]):
        p = layer_prefix(i)
        out.update({p + n + ".weight": proj.get(n) or norms[n] for n in layer})
    out[FINAL_NORM] = (C,)
    if not config.get("tie_word_embeddings"):
        out[LM_HEAD] = (V, C)
    return out


# HF BitNetConfig's defaults: what a config.json may leave out.
HF_DEFAULTS = dict(vocab_size=128256, hidden_size=2560, intermediate_size=6912, num_hidden_layers=30,
                   num_attention_heads=20, num_key_value_heads=None, rms_norm_eps=1e-5,
                   rope_theta=500000.0, max_position_embeddings=2048, tie_word_embeddings=False,
                   bos_token_id=128000, eos_token_id=128001, hidden_act="relu2")

# BitNet b1.58 2B-4T (its config.json's shapes).
CONFIG_2B4T = dict(hidden_size=2560, intermediate_size=6912, num_hidden_layers=30, num_attention_heads=20,
                   num_key_value_heads=5, vocab_size=128256, max_position_embeddings=4096, rope_theta=500000.0,
                   rms_norm_eps=1e-5, tie_word_embeddings=True, hidden_act="relu2")

# The demo model's (bitlora/demo/model/config.json; tests/test_demo_assets.py checks they agree).
DEMO_CONFIG = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=1024, max_position_embeddings=512, rope_theta=10000.0,
                   rms_norm_eps=1e-5, tie_word_embeddings=True, hidden_act="relu2", bos_token_id=0, eos_token_id=1)

SHAPES = {"2b4t": CONFIG_2B4T, "demo": DEMO_CONFIG}   # by the name the benchmarks take
