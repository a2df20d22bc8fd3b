"""The GPT's parameter count and causality; optimizer groups; the lr schedule."""

from __future__ import annotations

import pytest
import torch

from critbatch.science.model_size import param_count
from critbatch.training.config import ModelConfig, OptimConfig, TrainConfig
from critbatch.training.model import GPT
from critbatch.training.optim import build_optimizers, used_lr
from critbatch.training.schedule import lr_factor, wsd_decay_start

WIDTHS = (128, 192, 256, 320, 384)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("depth", (1, 4))
def test_param_count_matches_closed_form(width, depth):
    model = GPT(ModelConfig(width=width, depth=depth, heads=4, seq_len=64), vocab_size=1000)
    params, nonemb = param_count(width, depth, 64, 1000)
    assert sum(p.numel() for p in model.parameters()) == params
    assert nonemb == depth * 12 * width**2 + (2 * depth + 1) * width
    assert params - nonemb == (1000 + 64) * width


@pytest.mark.parametrize(("width", "depth", "seq_len"), [(32, 2, 16), (48, 3, 24)])
def test_flops_per_token_is_torch_s_count_in_kaplan_s_convention(width, depth, seq_len):
    """`flops_per_token` against torch.utils.flop_counter on one training step (attention on
    the math kernel, whose matmuls it counts): the same integer once the two conventions are
    set side by side. torch counts every matmul, attention's full T x T scores included (12 L T
    d a token over forward and backward); Kaplan et al.'s 6 N + 6 L T d counts half the scores
    (the causal mask's) and counts N's gains as multiply-adds (6 (2 L d + d)). Planted fault:
    a factor or a term of the closed form changed."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from critbatch.science.model_size import flops_per_token

    vocab, batch = 100, 2
    model = GPT(ModelConfig(width=width, depth=depth, heads=2, seq_len=seq_len), vocab)
    idx = torch.randint(0, vocab, (batch, seq_len))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(idx, idx).backward()
    per_token = counter.get_total_flops() // (batch * seq_len)
    assert per_token == 6 * (12 * depth * width**2 + vocab * width) + 12 * depth * seq_len * width
    kaplan = per_token - 6 * depth * seq_len * width + 6 * (2 * depth * width + width)
    assert flops_per_token(width, depth, seq_len, vocab) == kaplan


def test_model_is_causal_and_output_is_tied():
    torch.manual_seed(0)
    model = GPT(ModelConfig(width=32, depth=2, heads=2, seq_len=16), vocab_size=50)
    idx = torch.randint(0, 50, (2, 16))
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 50
    a, b = model(idx), model(changed)
    assert a.shape == (2, 16, 50)
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-6)
    assert not torch.allclose(a[:, 10:], b[:, 10:])
    assert "lm_head" not in dict(model.named_parameters())


def test_initial_loss_is_near_uniform():
    torch.manual_seed(0)
    model = GPT(ModelConfig(width=64, depth=2, heads=2, seq_len=32), vocab_size=2048)
    idx = torch.randint(0, 2048, (4, 33))
    loss = model(idx[:, :-1], idx[:, 1:])
    assert abs(loss.item() - torch.log(torch.tensor(2048.0)).item()) < 0.1


def _model():
    return GPT(ModelConfig(width=32, depth=3, heads=2, seq_len=16), vocab_size=64)


def test_muon_gets_exactly_the_2d_hidden_matrices():
    model = _model()
    muon, aux = build_optimizers(model, OptimConfig(name="muon"), 32, "cpu")
    assert isinstance(muon, torch.optim.Muon) and isinstance(aux, torch.optim.AdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    muon_names = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    aux_names = {names[id(p)] for g in aux.param_groups for p in g["params"]}
    expected = {
        f"blocks.{i}.{m}.weight" for i in range(3)
        for m in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")
    }
    assert muon_names == expected
    assert aux_names == set(names.values()) - expected
    assert {"wte.weight", "wpe.weight", "ln_f.weight"} <= aux_names
    assert all(g["weight_decay"] == 0.0 for g in aux.param_groups)


def _muon_steps(make, steps=4, adjust_lr_fn="original"):
    """Parameters (one wide, one tall matrix) after `steps` Muon steps on fixed gradients."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(32, 96)), torch.nn.Parameter(torch.randn(96, 32))]
    opt = make(params, lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True,
               adjust_lr_fn=adjust_lr_fn)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    return [p.detach() for p in params], opt


def test_muon_in_bfloat16_is_torchs_step_and_float32_is_close():
    """critbatch's Muon in bfloat16 is torch.optim.Muon bit for bit, state included; in
    float32 (the CPU default) it moves the weights by at most 1e-3 from it over 4 steps,
    a tenth of one step's update (lr 0.02)."""
    from functools import partial

    from critbatch.training.optim import Muon, ns_dtype

    want, theirs = _muon_steps(torch.optim.Muon)
    got, mine = _muon_steps(partial(Muon, ns_dtype=torch.bfloat16))
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
    assert mine.state_dict()["param_groups"] == theirs.state_dict()["param_groups"]
    close, _ = _muon_steps(partial(Muon, ns_dtype=torch.float32))
    drift = max((a - b).abs().max().item() for a, b in zip(want, close, strict=True))
    assert 0 < drift < 1e-3
    assert ns_dtype(OptimConfig(name="muon"), "cpu") == torch.float32
    assert ns_dtype(OptimConfig(name="muon"), "cuda") == torch.bfloat16
    assert ns_dtype(OptimConfig(name="muon", ns_dtype="bfloat16"), "cpu") == torch.bfloat16
    muon, _ = build_optimizers(_model(), OptimConfig(name="muon"), 32, "cpu")
    assert muon.ns_dtype == torch.float32


def test_muon_lr_scales_as_torchs_for_each_rule():
    """`muon_lr` (critbatch's own, no private torch import) gives torch.optim.Muon's step bit
    for bit under both lr rules: planted fault, a rule's factor or orientation swapped."""
    from functools import partial

    from critbatch.training.optim import Muon, muon_lr

    for rule in ("original", "match_rms_adamw"):
        want, _ = _muon_steps(torch.optim.Muon, adjust_lr_fn=rule)
        got, _ = _muon_steps(partial(Muon, ns_dtype=torch.bfloat16), adjust_lr_fn=rule)
        assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True)), rule
    assert muon_lr(0.02, "original", torch.Size([96, 32])) == pytest.approx(0.02 * 3 ** 0.5)
    assert muon_lr(0.02, "original", torch.Size([32, 96])) == 0.02
    moonlight = muon_lr(0.02, "match_rms_adamw", torch.Size([32, 96]))
    assert moonlight == pytest.approx(0.02 * 0.2 * 96 ** 0.5)


def test_adamw_decays_only_hidden_matrices():
    model = _model()
    (adamw,) = build_optimizers(model, OptimConfig(name="adamw", weight_decay=0.1), 32, "cpu")
    decayed = [p for g in adamw.param_groups if g["weight_decay"] > 0 for p in g["params"]]
    assert {id(p) for p in decayed} == {id(p) for p in model.hidden_matrices()}
    total = sum(len(g["params"]) for g in adamw.param_groups)
    assert total == len(list(model.parameters()))


def test_lr_scaling_sets_the_lr_used():
    cfg = OptimConfig(name="muon", lr=0.02, aux_lr=0.004, lr_scaling="sqrt", base_batch_size=16)
    assert used_lr(cfg, 64) == pytest.approx(0.04)
    muon, aux = build_optimizers(_model(), cfg, 64, "cpu")
    assert muon.param_groups[0]["peak_lr"] == pytest.approx(0.04)
    assert aux.param_groups[0]["peak_lr"] == pytest.approx(0.008)


@pytest.mark.parametrize(
    ("schedule", "step", "expected"),
    [
        ("cosine", 0, 0.1),  # warmup: (step + 1) / warmup_steps
        ("cosine", 9, 1.0),
        ("cosine", 10, 1.0),
        ("cosine", 55, 0.1 + 0.9 * 0.5),  # half way through the decay
        ("cosine", 100, 0.1),
        ("linear", 55, 1 - 0.9 * 0.5),
        ("linear", 100, 0.1),
        ("constant", 4, 0.5),
        ("constant", 100, 1.0),
        ("wsd", 79, 1.0),  # stable until the last 20% of 101 steps
        ("wsd", 100, 0.1),
    ],
)
def test_schedule_values(schedule, step, expected):
    train = TrainConfig(schedule=schedule, warmup_steps=10, min_lr_ratio=0.1,
                        cooldown_fraction=0.2)
    assert lr_factor(step, 101, train) == pytest.approx(expected)


def test_warmup_is_counted_in_steps_whatever_the_batch():
    small, large = TrainConfig(batch_size=16, warmup_steps=20), TrainConfig(batch_size=256,
                                                                             warmup_steps=20)
    # a run of 50 steps and one of 4000 warm up over the same 20 steps
    assert [lr_factor(s, 50, small) for s in range(20)] == [
        lr_factor(s, 4000, large) for s in range(20)]
    assert lr_factor(19, 50, small) == 1.0


def test_wsd_decays_monotonically_to_the_floor():
    train = TrainConfig(schedule="wsd", warmup_steps=5, min_lr_ratio=0.0, cooldown_fraction=0.3)
    values = [lr_factor(s, 200, train) for s in range(200)]
    assert values[-1] == pytest.approx(0.0)
    tail = values[140:]
    assert all(a >= b for a, b in zip(tail, tail[1:], strict=False))


def test_wsd_cooldown_is_one_minus_sqrt():
    # 100 steps, 20% cooldown: steps 80..99 decay; at step 84 (5 of 20 done) 1 - sqrt(1/4)
    train = TrainConfig(schedule="wsd", warmup_steps=10, min_lr_ratio=0.0, cooldown_fraction=0.2)
    assert lr_factor(79, 100, train) == 1.0
    assert lr_factor(84, 100, train) == pytest.approx(0.5)
    assert lr_factor(99, 100, train) == pytest.approx(0.0)


def test_a_shorter_wsd_run_is_a_prefix_of_a_longer_one_until_its_cooldown():
    train = TrainConfig(schedule="wsd", warmup_steps=10, cooldown_fraction=0.2)
    for short in (25, 50, 137):
        start = wsd_decay_start(short, train)
        assert [lr_factor(s, short, train) for s in range(start)] == [
            lr_factor(s, 1000, train) for s in range(start)]
        assert lr_factor(start, short, train) < 1.0
