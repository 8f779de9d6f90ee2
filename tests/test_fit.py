"""fit.fit_settings: the order in which a run too big for its memory is made smaller
(the page's Fit to device and the command line's out-of-memory advice share it)."""
from bitlora.config import TrainConfig
from bitlora.fit import adapters, as_flags, changes, fit_settings, smallest

CFG = TrainConfig(micro_batch_size=8, grad_accum=2, cutoff_len=256, lora_r=8, lora_alpha=16,
                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj"])


def cost(c):
    """A stand-in for memory: grows with every setting fit_settings may lower."""
    return ((2 if c.gradient_checkpointing else 5) * c.micro_batch_size * c.cutoff_len
            + 100 * c.lora_r * len(c.target_modules))


def test_checkpointing_comes_first():
    fit = fit_settings(CFG, lambda c: cost(c) <= cost(CFG) - 1, floor=40)
    assert changes(CFG, fit) == {"gradient_checkpointing": True}


def test_then_the_micro_batch_keeping_the_sequences_per_step():
    budget = 2 * 2 * 256 + 100 * 8 * 5
    fit = fit_settings(CFG, lambda c: cost(c) <= budget, floor=40)
    assert changes(CFG, fit) == {"gradient_checkpointing": True, "micro_batch_size": 2, "grad_accum": 8}


def test_then_the_cutoff_down_to_the_floor():
    budget = 2 * 1 * 40 + 100 * 8 * 5
    fit = fit_settings(CFG, lambda c: cost(c) <= budget, floor=40)
    assert (fit.micro_batch_size, fit.grad_accum, fit.cutoff_len, fit.lora_r) == (1, 16, 40, 8)


def test_a_smaller_adapter_only_when_nothing_else_fits():
    budget = 2 * 1 * 40 + 100 * 2 * 5
    fit = fit_settings(CFG, lambda c: cost(c) <= budget, floor=40)
    assert (fit.lora_r, fit.lora_alpha, fit.target_modules) == (2, 4.0, CFG.target_modules)
    assert fit_settings(CFG, lambda c: cost(c) <= budget, floor=40, keep_adapter=True) is None
    assert as_flags(changes(CFG, fit)) == ("gradient_checkpointing=True, micro_batch_size=1, grad_accum=16, "
                                           "cutoff_len=40, lora_r=2, lora_alpha=4")
    tiny = fit_settings(CFG, lambda c: cost(c) <= 2 * 40 + 100, floor=40)
    assert (tiny.lora_r, tiny.target_modules) == (1, ["q_proj"])


def test_nothing_fits_names_the_least():
    assert fit_settings(CFG, lambda c: False, floor=40) is None
    least = smallest(CFG, 40)
    assert (least.micro_batch_size, least.cutoff_len, least.lora_r, least.target_modules) == (1, 40, 1, ["q_proj"])
    assert adapters(CFG)[0] == (8, 16.0, CFG.target_modules)
    assert smallest(CFG, 40, keep_adapter=True).lora_r == 8
