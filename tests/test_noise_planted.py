"""Both B_noise estimators against a planted quadratic whose G and Sigma are known, and the
public tracker (`critbatch.noise.NoiseTracker`) inside a plain PyTorch loop.

The quadratic: per example x ~ N(mu, diag(s^2)) and loss 1/2 sum_j h_j (theta_j - x_j)^2, so
the per-example gradient is h (theta - x): G = h (theta - mu), Sigma = diag(h^2 s^2), and
B_simple = tr(Sigma) / |G|^2 = sum h^2 s^2 / sum h^2 (theta - mu)^2 exactly.
"""

from __future__ import annotations

import math

import pytest
import torch

from critbatch.noise import NoiseTracker
from critbatch.science.noise import estimate
from critbatch.training.gns import (
    group_sums,
    hessian_group_sums,
    hessian_vector_product,
    micro_batch_gradients,
)

P = 64


class Quadratic(torch.nn.Module):
    """theta (P,), the Hessian's diagonal h; forward(x, _) is the mean loss over x's rows
    (x: (b, P) examples; the second argument, the trainer's targets, is ignored)."""

    def __init__(self, h: torch.Tensor, theta: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("h", h)
        self.theta = torch.nn.Parameter(theta.clone())

    def forward(self, x: torch.Tensor, _targets: torch.Tensor | None = None) -> torch.Tensor:
        return 0.5 * (self.h * (self.theta - x) ** 2).sum(-1).mean()


def world(seed: int = 0):
    """(model, mu, s, the true B_simple): B_simple = 25 examples."""
    gen = torch.Generator().manual_seed(seed)
    h = torch.exp(3 * torch.rand(P, generator=gen, dtype=torch.float64) - 1.5)  # 0.22-4.5
    mu = torch.randn(P, generator=gen, dtype=torch.float64)
    s = 0.5 + torch.rand(P, generator=gen, dtype=torch.float64)
    direction = torch.randn(P, generator=gen, dtype=torch.float64)
    # theta - mu scaled so that |G|^2 = tr(Sigma) / 25
    trace = float((h**2 * s**2).sum())
    scale = math.sqrt(trace / 25 / float((h**2 * direction**2).sum()))
    model = Quadratic(h, mu + scale * direction)
    return model, mu, s, 25.0


def examples(mu, s, n: int, gen) -> torch.Tensor:
    return mu + s * torch.randn(n, P, generator=gen, dtype=torch.float64)


def test_the_noise_program_s_estimator_recovers_the_planted_b_noise():
    model, mu, s, truth = world()
    gen = torch.Generator().manual_seed(1)
    k, b = 1024, 4
    x = examples(mu, s, k * b, gen)
    # micro_batch_gradients feeds (batch[:, :-1], batch[:, 1:]): a last column it drops
    windows = torch.cat([x, torch.zeros(k * b, 1, dtype=x.dtype)], 1)
    gradients = micro_batch_gradients(model, windows.split(b), torch.device("cpu"),
                                      torch.autocast("cpu", enabled=False))
    est = estimate(group_sums(gradients, 16), b)
    # K = 1024 at b = 4: a few % noise; 10% and inside 3 jackknife errors
    assert est.b_noise == pytest.approx(truth, rel=0.10)
    se = math.log(est.b_noise_high / est.b_noise)
    assert abs(math.log(est.b_noise / truth)) < 3 * se


def test_b_full_weighs_the_noise_by_the_hessian():
    """B_full = tr(H Sigma) / G'HG (McCandlish et al. 2018, eq. 2.7): on the quadratic H =
    diag(h), so it is sum h^3 s^2 / sum h^3 (theta - mu)^2, unlike B_simple; the Hessian is
    taken by Hessian-vector products on other windows than the gradients'."""
    model, mu, s, simple = world()
    h, d = model.h, model.theta.detach() - mu
    truth = float((h**3 * s**2).sum() / (h**3 * d**2).sum())
    assert abs(truth / simple - 1) > 0.1  # the Hessian's weighting matters here
    gen = torch.Generator().manual_seed(3)
    k, b = 1024, 4
    pad = torch.zeros(k * b, 1, dtype=torch.float64)
    windows = torch.cat([examples(mu, s, k * b, gen), pad], 1)
    other = torch.cat([examples(mu, s, 64, gen), pad[:64]], 1)
    cpu = torch.device("cpu")
    hvp = hessian_vector_product(model, other, cpu)
    v = torch.randn(P, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(hvp(v), h * v)  # a quadratic's Hessian is h everywhere
    gradients = micro_batch_gradients(model, windows.split(b), cpu,
                                      torch.autocast("cpu", enabled=False))
    est = estimate(hessian_group_sums(gradients, hvp, 16), b)
    assert est.b_noise == pytest.approx(truth, rel=0.10)
    assert abs(math.log(est.b_noise / truth)) < 3 * math.log(est.b_noise_high / est.b_noise)


@pytest.mark.slow
def test_the_online_tracker_recovers_the_planted_b_noise_in_a_plain_loop():
    """The parameters held still (no optimizer step): 3,000 steps of 4 micro-batches of 4,
    averaged with a slow EMA, give B_simple to within 10%."""
    model, mu, s, truth = world()
    gen = torch.Generator().manual_seed(2)
    tracker = NoiseTracker(model.parameters(), micro_batch_size=4, ema=0.999)
    for _ in range(3000):
        model.zero_grad()
        for micro in examples(mu, s, 16, gen).split(4):
            (model(micro) / 4).backward()
            tracker.micro_batch()
        tracker.step()
    tracker.close()
    assert tracker.b_noise == pytest.approx(truth, rel=0.10)
    # its two averages, each against its own truth
    g = model.h * (model.theta.detach() - mu)
    assert tracker.g2 == pytest.approx(float(g.square().sum()), rel=0.15)
    assert tracker.trace == pytest.approx(float((model.h**2 * s**2).sum()), rel=0.05)


def test_the_tracker_leaves_training_unchanged_and_needs_two_micro_batches():
    """A ~15-line loop (docs/running.md's example): the same weights with and without the
    tracker, and a B_noise once trained."""
    def run(track: bool):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                    torch.nn.Linear(16, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        tracker = NoiseTracker(model.parameters(), micro_batch_size=8) if track else None
        gen = torch.Generator().manual_seed(1)
        for _ in range(200):
            x = torch.randn(32, 8, generator=gen)
            y = x.sum(1, keepdim=True) + 0.5 * torch.randn(32, 1, generator=gen)
            for xs, ys in zip(x.split(8), y.split(8), strict=True):
                (torch.nn.functional.mse_loss(model(xs), ys) / 4).backward()
                if tracker:
                    tracker.micro_batch()
            if tracker:
                tracker.step()
            optimizer.step()
            optimizer.zero_grad()
        return model, tracker

    plain, _ = run(False)
    tracked, tracker = run(True)
    for a, b in zip(plain.parameters(), tracked.parameters(), strict=True):
        assert torch.equal(a, b)
    assert tracker.b_noise is not None and tracker.b_noise > 0
    tracker.small.append(torch.tensor(1.0))
    with pytest.raises(ValueError, match="two or more"):
        tracker.step()
