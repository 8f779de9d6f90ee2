"""PEFT adapter files: ours load in PEFT on a tiny transformers BitNet, PEFT's load
in ours, tensors equal; PEFT's init distribution; training-state checkpoints and
metrics.jsonl."""
from __future__ import annotations

import array
import json
import math
import os
import random

import pytest

from bitlora.formats import peft as adapter
from bitlora.formats import safetensors as safetensors_io
from bitlora.formats import state as checkpoint_state
from bitlora.config import TrainConfig
from bitlora.metrics import MetricsWriter, read_metrics

HF_CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=8)
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _tiny_bitnet():
    import torch
    from transformers import BitNetConfig, BitNetForCausalLM
    torch.manual_seed(0)
    return BitNetForCausalLM(BitNetConfig(**HF_CONFIG, bos_token_id=1, eos_token_id=2, pad_token_id=0))


def _random_tensors(shapes, seed=0):
    rng = random.Random(seed)
    return {k: (s, array.array("f", (rng.uniform(-1, 1) for _ in range(s[0] * s[1])))) for k, s in shapes}


def test_shapes_match_peft_on_bitnet():
    from peft import LoraConfig, get_peft_model
    for targets in (["q_proj", "v_proj"], ALL, ["down_proj", "k_proj"]):
        model = get_peft_model(_tiny_bitnet(), LoraConfig(r=4, target_modules=targets, task_type="CAUSAL_LM"))
        peft = {k.replace(".default", ""): tuple(p.shape) for k, p in model.named_parameters() if p.requires_grad}
        ours = adapter.lora_shapes(HF_CONFIG, targets, 4)
        assert dict(ours) == peft
        assert len(ours) == len(peft)


@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], ALL])
def test_our_adapter_loads_in_peft(tmp_path, targets):
    import torch
    from peft import PeftModel
    cfg = TrainConfig(lora_r=4, lora_alpha=8, lora_dropout=0.1, target_modules=targets)
    tensors = _random_tensors(adapter.lora_shapes(HF_CONFIG, targets, 4))
    adapter.save_adapter(tmp_path, tensors, cfg, base_model_name_or_path="tiny")
    model = PeftModel.from_pretrained(_tiny_bitnet(), str(tmp_path))
    conf = model.peft_config["default"]
    assert (conf.r, conf.lora_alpha, conf.lora_dropout, set(conf.target_modules)) == (4, 8, 0.1, set(targets))
    got = {k.replace(".default", ""): p.detach() for k, p in model.named_parameters() if "lora_" in k}
    assert set(got) == set(tensors)
    for k, (shape, arr) in tensors.items():
        assert torch.equal(got[k], torch.tensor(list(arr), dtype=torch.float32).reshape(shape)), k


def test_peft_adapter_loads_in_ours_and_config_keys_match(tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    targets = ["q_proj", "k_proj", "down_proj"]
    model = get_peft_model(_tiny_bitnet(), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.05,
                                                       target_modules=targets, task_type="CAUSAL_LM"))
    with torch.no_grad():
        for k, p in model.named_parameters():
            if "lora_B" in k:
                p.normal_()
    model.save_pretrained(str(tmp_path / "peft"))
    conf, tensors = adapter.load_adapter(tmp_path / "peft")
    want = {k.replace(".default", ""): p.detach() for k, p in model.named_parameters() if "lora_" in k}
    assert set(tensors) == set(want)
    for k, (shape, arr) in tensors.items():
        assert torch.equal(torch.tensor(list(arr), dtype=torch.float32).reshape(shape), want[k])
    adapter.check_tensors(tensors, adapter.lora_shapes(HF_CONFIG, targets, 4))
    settings = adapter.adapter_settings(conf)
    assert settings == {"lora_r": 4, "lora_alpha": 8, "lora_dropout": 0.05,
                        "target_modules": ["q_proj", "k_proj", "down_proj"]}
    # we write the same config keys PEFT does (values aside)
    ours = adapter.adapter_config(4, 8, 0.05, targets)
    assert set(ours) == set(conf), set(ours) ^ set(conf)
    for k in ("peft_type", "bias", "task_type", "init_lora_weights", "use_dora", "use_rslora"):
        assert ours[k] == conf[k], k


@pytest.mark.parametrize("targets", ["all-linear", r".*\.(q_proj|down_proj)", ["model.layers.0.self_attn.v_proj",
                                                                               "model.layers.1.self_attn.v_proj"]])
def test_peft_target_module_forms_and_a_float_alpha(tmp_path, targets):
    """PEFT's other target_modules forms (all-linear, saved as module paths; a regular
    expression over the paths; paths) name the adapted modules through the tensors' keys;
    a float lora_alpha is kept, also through a training-state checkpoint's config."""
    from peft import LoraConfig, get_peft_model
    model = get_peft_model(_tiny_bitnet(), LoraConfig(r=2, lora_alpha=3.5, target_modules=targets,
                                                       task_type="CAUSAL_LM"))
    model.save_pretrained(str(tmp_path / "peft"))
    conf, tensors = adapter.load_adapter(tmp_path / "peft")
    settings = adapter.adapter_settings(conf, tensors)
    want = {"all-linear": ALL, r".*\.(q_proj|down_proj)": ["q_proj", "down_proj"]}.get(str(targets), ["v_proj"])
    assert settings["target_modules"] == want and settings["lora_alpha"] == 3.5
    adapter.check_tensors(tensors, adapter.lora_shapes(HF_CONFIG, want, 2))
    cfg = TrainConfig(**settings)
    assert TrainConfig.from_dict(cfg.to_dict()).lora_alpha == 3.5
    assert TrainConfig(lora_alpha=16.0).lora_alpha == 16 and isinstance(TrainConfig(lora_alpha=16.0).lora_alpha, int)


def test_load_adapter_refuses_what_it_cannot_represent(tmp_path):
    cfg = TrainConfig(lora_r=2)
    adapter.save_adapter(tmp_path, _random_tensors(adapter.lora_shapes(HF_CONFIG, cfg.target_modules, 2)), cfg)
    good = json.loads((tmp_path / adapter.CONFIG_FILE).read_text())
    for change, match in ((dict(rank_pattern={"q_proj": 4}), "rank_pattern"), (dict(alpha_pattern={"v_proj": 2}), "alpha_pattern"),
                          (dict(layers_to_transform=[0]), "layers_to_transform"), (dict(target_modules=None), "target_modules")):
        (tmp_path / adapter.CONFIG_FILE).write_text(json.dumps({**good, **change}))
        with pytest.raises(ValueError, match=match):
            adapter.load_adapter(tmp_path)
    (tmp_path / adapter.CONFIG_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="adapter_config.json: not a JSON"):
        adapter.load_adapter(tmp_path)


def test_round_trip_and_header(tmp_path):
    cfg = TrainConfig(lora_r=2, target_modules=["o_proj", "up_proj"])
    tensors = _random_tensors(adapter.lora_shapes(HF_CONFIG, cfg.target_modules, 2), seed=3)
    adapter.save_adapter(tmp_path, tensors, cfg)
    conf, back = adapter.load_adapter(tmp_path)
    assert back == {k: (tuple(s), a) for k, (s, a) in tensors.items()}
    raw = (tmp_path / adapter.WEIGHTS_FILE).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert n % 8 == 0 and json.loads(raw[8:8 + n])["__metadata__"] == {"format": "pt"}
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]


def test_f16_and_bf16_tensors_read_as_f32(tmp_path):
    import torch
    from safetensors.torch import save_file
    t = torch.randn(3, 5)
    save_file({"a": t.half(), "b": t.bfloat16()}, str(tmp_path / "x.safetensors"))
    got, _ = safetensors_io.loads((tmp_path / "x.safetensors").read_bytes())
    assert list(got["a"][1]) == t.half().float().flatten().tolist()
    assert list(got["b"][1]) == t.bfloat16().float().flatten().tolist()


def test_init_is_peft_distribution():
    shapes = adapter.lora_shapes(HF_CONFIG, ALL, 8)
    t = adapter.init_lora(shapes, seed=1)
    assert t == adapter.init_lora(shapes, seed=1)
    assert t != adapter.init_lora(shapes, seed=2)
    for k, (shape, arr) in t.items():
        if ".lora_B." in k:
            assert not any(arr)
        else:
            bound = 1 / math.sqrt(shape[1])
            assert max(abs(x) for x in arr) <= bound
            assert max(abs(x) for x in arr) > 0.8 * bound          # fills the range
            mean_sq = sum(x * x for x in arr) / len(arr)
            assert abs(mean_sq - bound * bound / 3) < 0.35 * bound * bound / 3   # var of U(-b,b)
    # a tensor's init does not depend on which other modules are targeted
    only_q = adapter.init_lora(adapter.lora_shapes(HF_CONFIG, ["q_proj"], 8), seed=1)
    k = adapter.peft_key(1, "q_proj", "A")
    assert only_q[k] == t[k]


def test_load_adapter_errors(tmp_path):
    with pytest.raises(ValueError, match="adapter_config.json"):
        adapter.load_adapter(tmp_path)
    cfg = TrainConfig(lora_r=2)
    adapter.save_adapter(tmp_path, _random_tensors(adapter.lora_shapes(HF_CONFIG, cfg.target_modules, 2)), cfg)
    conf = json.loads((tmp_path / adapter.CONFIG_FILE).read_text())
    conf["use_dora"] = True
    (tmp_path / adapter.CONFIG_FILE).write_text(json.dumps(conf))
    with pytest.raises(ValueError, match="use_dora"):
        adapter.load_adapter(tmp_path)
    with pytest.raises(ValueError, match="shape"):
        _, t = {}, _random_tensors(adapter.lora_shapes(HF_CONFIG, ["q_proj", "v_proj"], 2))
        adapter.check_tensors(t, adapter.lora_shapes(HF_CONFIG, ["q_proj", "v_proj"], 4))


# -- training state ----------------------------------------------------------------------

def _state_args(seed=0):
    shapes = adapter.lora_shapes(HF_CONFIG, ["q_proj", "v_proj"], 2)
    return dict(step=12, params=_random_tensors(shapes, seed), exp_avg=_random_tensors(shapes, seed + 1),
                exp_avg_sq=_random_tensors(shapes, seed + 2),
                cursor={"epoch": 1, "micro_batch": 3, "step": 12, "fingerprint": "ab"},
                rng={"dropout_seed": 5}, config=TrainConfig(lora_r=2).to_dict(), extra={"skipped": 0})


def test_state_round_trip(tmp_path):
    a = _state_args()
    checkpoint_state.save_state(tmp_path / "ck", **a)
    st = checkpoint_state.load_state(tmp_path / "ck")
    norm = lambda d: {k: (tuple(s), v) for k, (s, v) in d.items()}  # noqa: E731
    assert st.step == 12 and st.cursor == a["cursor"] and st.rng == a["rng"] and st.extra == a["extra"]
    assert st.params == norm(a["params"]) and st.exp_avg == norm(a["exp_avg"])
    assert st.exp_avg_sq == norm(a["exp_avg_sq"])
    assert TrainConfig.from_dict(st.config) == TrainConfig(lora_r=2)
    # the PEFT adapter beside it holds the same parameters
    _, t = adapter.load_adapter(tmp_path / "ck")
    assert t == st.params


def test_interrupted_save_keeps_previous_state(tmp_path, monkeypatch):
    ck = tmp_path / "ck"
    checkpoint_state.save_state(ck, **_state_args(0))

    def crash(src, dst):
        raise KeyboardInterrupt("killed between write and rename")
    monkeypatch.setattr(os, "replace", crash)
    b = _state_args(10)
    b["step"] = 13
    with pytest.raises(KeyboardInterrupt):
        checkpoint_state.save_state(ck, **b)
    monkeypatch.undo()
    st = checkpoint_state.load_state(ck)
    assert st.step == 12 and st.params["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"][1] \
        == _state_args(0)["params"]["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"][1]


def test_state_errors(tmp_path):
    with pytest.raises(ValueError, match="no training state"):
        checkpoint_state.load_state(tmp_path)
    (tmp_path / checkpoint_state.STATE_FILE).write_bytes(safetensors_io.dumps({"a": ((1,), [1.0])}))
    with pytest.raises(ValueError, match="not a bitlora training state"):
        checkpoint_state.load_state(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')   # --resume naming the wrong file
    for read in (checkpoint_state.load_state, checkpoint_state.load_config):
        with pytest.raises(ValueError, match=r"not a bitlora training state \(give a checkpoint folder"):
            read(tmp_path / "metrics.jsonl")
    a = _state_args()
    a["exp_avg"].popitem()
    with pytest.raises(ValueError, match="exp_avg"):
        checkpoint_state.save_state(tmp_path / "x", **a)


def test_python_random_state_json_round_trip():
    r = random.Random(5)
    r.random()
    s = json.loads(json.dumps(checkpoint_state.random_state_to_json(r)))
    r2 = checkpoint_state.random_state_from_json(s)
    assert [r.random() for _ in range(5)] == [r2.random() for _ in range(5)]


# -- metrics -------------------------------------------------------------------------------

def _m(step):
    return {"step": step, "loss": 2.0 / step, "grad_norm": 0.5, "lr": 1e-4, "tokens": 10, "tokens_per_s": 99.0}


def test_metrics_append_and_resume_truncation(tmp_path):
    p = tmp_path / "out" / "metrics.jsonl"
    mw = MetricsWriter(p)
    for s in range(1, 6):
        mw.write(_m(s))
    assert [r["step"] for r in read_metrics(p)] == [1, 2, 3, 4, 5]
    mw = MetricsWriter(p, resume_step=3)          # steps 4, 5 came after the checkpoint
    assert [r["step"] for r in read_metrics(p)] == [1, 2, 3]
    mw.write(_m(4))
    assert read_metrics(p)[-1] == _m(4)
    with pytest.raises(ValueError, match="grad_norm"):
        mw.write({"step": 5, "loss": 1.0})
    mw.write({**_m(5), "loss": float("nan")})
    assert read_metrics(p)[-1]["loss"] is None
    replaced = []
    fresh = MetricsWriter(p, on_replace=lambda: replaced.append(True))
    assert len(read_metrics(p)) == 5 and not replaced      # an earlier run's steps stay until a new one lands
    fresh.write(_m(1))
    fresh.write(_m(2))
    assert read_metrics(p) == [_m(1), _m(2)] and replaced == [True]   # then only the new run's, told once
    MetricsWriter(tmp_path / "new" / "metrics.jsonl")
    assert read_metrics(tmp_path / "new" / "metrics.jsonl") == []     # a new folder: an empty file at once
