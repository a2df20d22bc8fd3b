"""Gradient noise scale B_noise = tr(Sigma) / |G|^2: estimator, online tracker, and program.

    python -m critbatch.noise RUN_DIR [--micro-batches K] [--micro-batch-size b] [--seed S]

measures B_noise at a run's checkpoint, prints one row of science.md's reference table and
writes `RUN_DIR/noise.json` (keys: `runs.NOISE_KEYS`).

The maths (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training", App. A;
science.md section 2). G is the true gradient, Sigma the per-example gradient covariance.
The gradient of a batch of B i.i.d. examples satisfies

    E |g_B|^2 = |G|^2 + tr(Sigma) / B

so squared norms measured at two batch sizes b < B solve to unbiased estimates

    |G|^2     ~ (B |g_B|^2 - b |g_b|^2) / (B - b)
    tr(Sigma) ~ (|g_b|^2 - |g_B|^2) / (1/b - 1/B).

With K micro-batches of b sequences, |g_b|^2 is the mean of their squared norms and g_B the
mean of their gradients (B = K b). The |G|^2 estimate is then exactly the mean over i != j of
<g_i, g_j> (a U-statistic): unbiased, and negative when noise dominates. Each estimate is
unbiased, their ratio is not; so average the two separately and divide last. A non-positive
|G|^2 (or tr(Sigma)) estimate means "not resolved, increase K": B_noise is then reported as
missing (None), never as a negative or infinite number.

Assumptions: an example is one sequence of seq_len tokens and the loss is its mean token
loss, so B_noise is in sequences (x seq_len for tokens); examples are i.i.d. (windows at
random offsets of the token stream, drawn with replacement); the parameters do not move
between the two measurements (true offline; online, within one optimizer step).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from critbatch import runs
from critbatch.errors import ConfigError, DataError, ResultsError, fail, user_errors

JACKKNIFE_GROUPS = 16  # micro-batches are dealt into this many groups for the error bar


# ---------------------------------------------------------------------------
# The estimator (pure functions)


def g2_estimate(g2_small, g2_big, b: int, big: int):
    """Unbiased |G|^2 from the mean squared norm at batch b and the squared norm at batch big."""
    return (big * g2_big - b * g2_small) / (big - b)


def trace_estimate(g2_small, g2_big, b: int, big: int):
    """Unbiased tr(Sigma) (per example) from the same two squared norms."""
    return (g2_small - g2_big) / (1 / b - 1 / big)


def noise_scale(trace: float, g2: float) -> float | None:
    """B_noise = tr(Sigma) / |G|^2 in examples; None when either estimate is not positive."""
    if not (g2 > 0 and trace > 0 and math.isfinite(g2) and math.isfinite(trace)):
        return None
    return trace / g2


@dataclass
class NoiseEMA:
    """Bias-corrected moving averages of |G|^2, tr(Sigma) and the loss; B_noise from their ratio.

    Per optimizer step the accumulation gives |g_b|^2 (b = micro-batch size) and |g_B|^2
    (B = batch size); each step's two unbiased estimates are averaged separately and the
    ratio is taken of the averages (a per-step ratio is biased and often undefined, its
    |G|^2 being negative). Bias correction as in Adam (Kingma & Ba 2015): each EMA is divided
    by 1 - decay^n, so early values are not pulled towards the zero the EMAs start from.

    Warning: a ratio of averages weights each step by its gradient scale. One gradient spike
    (|g_B|^2 ~1000x normal, seen in early training on the smoke preset) would dominate both
    averages for hundreds of steps, so a step whose |g_B|^2 exceeds `spike_factor` x the
    average |g_B|^2 so far is left out (counted in `skipped`), as are non-finite steps.
    """

    decay: float  # per optimizer step
    b: int  # small batch, sequences
    big: int  # big batch, sequences
    g2_sum: float = 0.0
    trace_sum: float = 0.0
    loss_sum: float = 0.0
    spike_factor: float = 100.0  # skip steps with |g_B|^2 above this x its average (norm 10x)
    big_sum: float = 0.0  # EMA of |g_B|^2
    weight: float = 0.0  # 1 - decay^n after n updates
    steps: int = 0  # updates taken
    skipped: int = 0  # spikes and non-finite steps left out

    def update(self, g2_small: float, g2_big: float, loss: float, big: int | None = None) -> dict:
        """Fold in one step; return that step's raw estimates and the averaged values.

        `big`: this step's batch when it differs from `self.big` (a scheduled batch).
        """
        big = big or self.big
        g2 = g2_estimate(g2_small, g2_big, self.b, big)
        trace = trace_estimate(g2_small, g2_big, self.b, big)
        spike = self.weight > 0 and g2_big > self.spike_factor * self.big_sum / self.weight
        if all(math.isfinite(v) for v in (g2, trace, loss)) and not spike:
            d = self.decay
            self.g2_sum = d * self.g2_sum + (1 - d) * g2
            self.trace_sum = d * self.trace_sum + (1 - d) * trace
            self.loss_sum = d * self.loss_sum + (1 - d) * loss
            self.big_sum = d * self.big_sum + (1 - d) * g2_big
            self.weight = d * self.weight + (1 - d)
            self.steps += 1
        else:
            self.skipped += 1
        return {"gns_g2": self.g2, "gns_trace": self.trace, "b_noise": self.b_noise,
                "gns_g2_step": g2, "gns_trace_step": trace}

    @property
    def g2(self) -> float | None:
        return self.g2_sum / self.weight if self.weight else None

    @property
    def trace(self) -> float | None:
        return self.trace_sum / self.weight if self.weight else None

    @property
    def loss(self) -> float | None:
        return self.loss_sum / self.weight if self.weight else None

    @property
    def b_noise(self) -> float | None:
        return noise_scale(self.trace, self.g2) if self.weight else None


class MicroGradNorms:
    """Each micro-batch's own squared gradient norm during accumulation, at no extra pass.

    A hook on every parameter sees the gradient that micro-batch i's backward of
    (loss_i / accum) is about to add into .grad, which is g_i / accum, so

        |g_i|^2 = accum^2 sum_params |incoming grad|^2.

    The hooks only collect these incoming gradients (a list append: the gradient and its
    accumulation are unchanged); `pop`, right after the micro-batch's backward, takes their
    total norm in one multi-tensor kernel (`torch.nn.utils.get_total_norm`) on the device, no
    host sync. Holding them until then costs one gradient's worth of memory. (A norm in
    each hook, as first written, launched ~40 small kernels per micro-batch; measured on the
    bench's gns shape, one thread, interleaved: +4.4% and +8.7% on the accumulation against
    +2.3% and +4.2% for this, in two runs under different load.)
    The big batch costs nothing: |g_B|^2 is the square of the pre-clipping norm that
    `clip_grad_norm_` returns anyway.

    Future path (not implemented): under data parallelism (torchrun) each rank's local
    gradient before the all-reduce is another small batch for free (science.md section 2).
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], accum: int) -> None:
        self.accum = accum
        self.grads: list[torch.Tensor] = []  # incoming gradients of the running backward
        self.handles = [p.register_hook(self.grads.append) for p in params if p.requires_grad]

    @torch.no_grad()
    def pop(self) -> torch.Tensor:
        """|g_i|^2 (0-d tensor) of the micro-batch whose backward just ran."""
        norm = torch.nn.utils.get_total_norm(self.grads, norm_type=2.0)
        self.grads.clear()
        return norm.float().square() * self.accum**2

    def remove(self) -> None:
        """Detach the hooks (the model is then as if never tracked)."""
        for handle in self.handles:
            handle.remove()


# ---------------------------------------------------------------------------
# Offline: K micro-batches and a jackknife error bar


@dataclass
class GroupSums:
    """What the estimate and its jackknife need from K micro-batch gradients g_i.

    The micro-batches are dealt round-robin into m groups; T_k is the sum of the gradients
    in group k. The full-batch norm is |sum_k T_k|^2 / K^2 = gram.sum() / K^2, and the same
    with any groups left out, so every jackknife replicate comes from this m x m matrix.
    """

    gram: np.ndarray  # (m, m) float64: <T_k, T_l>
    sq_sums: np.ndarray  # (m,) sum over group k of |g_i|^2
    counts: np.ndarray  # (m,) micro-batches in group k
    loss_sums: np.ndarray  # (m,) sum over group k of the micro-batch losses (nats/token)


@dataclass
class NoiseEstimate:
    micro_batches: int  # K
    micro_batch_size: int  # b, sequences
    loss: float  # mean train loss over the K b sequences, nats/token
    g2: float  # |G|^2
    trace: float  # tr(Sigma), per sequence
    g2_stderr: float | None
    trace_stderr: float | None
    b_noise: float | None  # sequences; None = not resolved
    b_noise_low: float | None  # 68% interval (1 sigma in log B_noise); None = unbounded
    b_noise_high: float | None
    groups: int  # jackknife groups


def micro_batch_gradients(model: torch.nn.Module, micro_batches: Iterable[torch.Tensor],
                          device: torch.device, autocast) -> Iterator[tuple]:
    """(flat gradient (P,), loss) of each micro-batch (b, T+1) of token ids: one fwd + bwd."""
    params = [p for p in model.parameters() if p.requires_grad]
    for batch in micro_batches:
        batch = batch.to(device, non_blocking=True)
        model.zero_grad(set_to_none=True)
        with autocast:
            loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        yield torch.cat([p.grad.flatten() for p in params]), loss.detach()
    model.zero_grad(set_to_none=True)


def group_sums(gradients: Iterable[tuple], groups: int) -> GroupSums:
    """Deal (gradient, loss) pairs round-robin into `groups` groups; their `GroupSums`."""
    sums = sq_sums = loss_sums = None
    counts = np.zeros(groups, dtype=np.int64)
    for i, (grad, loss) in enumerate(gradients):
        if sums is None:
            sums = torch.zeros(groups, grad.numel(), device=grad.device)  # (m, P): T_k
            sq_sums = torch.zeros(groups, dtype=torch.float64, device=grad.device)
            loss_sums = torch.zeros(groups, dtype=torch.float64, device=grad.device)
        k = i % groups
        sums[k] += grad
        sq_sums[k] += grad.double().square().sum()
        loss_sums[k] += loss
        counts[k] += 1
    sums64 = sums.double()
    return GroupSums(gram=(sums64 @ sums64.T).cpu().numpy(), sq_sums=sq_sums.cpu().numpy(),
                     counts=counts, loss_sums=loss_sums.cpu().numpy())


def estimate_from_groups(s: GroupSums, b: int, keep: np.ndarray | None = None) -> tuple:
    """(|G|^2, tr(Sigma)) from the groups in `keep` (a boolean mask; all by default)."""
    keep = np.ones(len(s.counts), bool) if keep is None else keep
    k = int(s.counts[keep].sum())
    g2_small = s.sq_sums[keep].sum() / k
    g2_big = s.gram[np.ix_(keep, keep)].sum() / k**2
    return float(g2_estimate(g2_small, g2_big, b, k * b)), float(
        trace_estimate(g2_small, g2_big, b, k * b))


def estimate(s: GroupSums, b: int) -> NoiseEstimate:
    """Point estimates and delete-a-group jackknife errors (Quenouille 1956; Tukey 1958).

    Why the jackknife and not the bootstrap: every delete-a-group subset is itself a valid
    sample of K' < K micro-batches, so each replicate is the same unbiased estimator. A
    bootstrap resample repeats micro-batches, and a repeated gradient's inner product with
    itself enters |g_B|^2 as if it were a cross term, inflating |G|^2 in every replicate.
    With m groups, SE^2 = (m-1)/m sum_k (theta_{-k} - mean)^2. B_noise's interval is
    taken in log B_noise (a ratio is skewed; the interval stays positive) at 1 sigma:
    B exp(-SE), B exp(+SE). If a replicate is not resolved, the interval is unbounded (None).
    The error bar has m - 1 degrees of freedom: itself uncertain by about 1/sqrt(2(m-1)).
    """
    g2, trace = estimate_from_groups(s, b)
    m, big_k = len(s.counts), int(s.counts.sum())
    b_noise = noise_scale(trace, g2)
    g2_se = trace_se = low = high = None
    if m >= 2 and big_k - s.counts.max() >= 2:
        reps = np.array([estimate_from_groups(s, b, np.arange(m) != k) for k in range(m)])
        g2_se, trace_se = (float(math.sqrt((m - 1) / m * ((reps[:, j] - reps[:, j].mean()) ** 2)
                                           .sum())) for j in (0, 1))
        ratios = [noise_scale(tr, g) for g, tr in reps]
        if b_noise is not None and all(r is not None for r in ratios):
            logs = np.log(ratios)
            se = math.sqrt((m - 1) / m * ((logs - logs.mean()) ** 2).sum())
            low, high = b_noise * math.exp(-se), b_noise * math.exp(se)
    return NoiseEstimate(
        micro_batches=big_k, micro_batch_size=b, loss=float(s.loss_sums.sum() / big_k),
        g2=g2, trace=trace, g2_stderr=g2_se, trace_stderr=trace_se, b_noise=b_noise,
        b_noise_low=low, b_noise_high=high, groups=m,
    )


# ---------------------------------------------------------------------------
# The program


def load_checkpoint(run_dir: Path) -> tuple:
    """(Config, state_dict, step) from `run_dir/checkpoint.pt`; ResultsError if unusable."""
    from omegaconf import OmegaConf

    from critbatch.config import Config, validate

    path = run_dir / "checkpoint.pt"
    if not run_dir.is_dir():
        raise ResultsError(f"{run_dir} is not a directory; pass a run directory (runs/...)")
    if not path.exists():
        raise ResultsError(f"{run_dir} has no checkpoint.pt; pass a finished run's directory "
                           "or train one first (make train)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        merged = OmegaConf.merge(OmegaConf.structured(Config), ckpt["config"])
        cfg = OmegaConf.to_object(merged)
        validate(cfg)
    except Exception as err:  # truncated file, old or foreign format
        first = (str(err).splitlines() or [type(err).__name__])[0]
        raise ResultsError(f"{path} cannot be loaded ({first}); rerun the training") from None
    return cfg, ckpt["model"], int(ckpt["step"])


def measure_run(run_dir: Path, micro_batches: int = 128, micro_batch_size: int = 4,
                seed: int | None = None, device_name: str = "auto",
                cache_dir: str | None = None) -> dict:
    """Measure B_noise at `run_dir`'s checkpoint; write noise.json; return its dict.

    Windows come from the train split, drawn like training step `step` (the checkpoint's)
    would draw them with seed `seed` (default: the run's): data the model has not yet
    trained on, from the distribution it trains on.
    """
    from critbatch.config import wandb_group
    from critbatch.data import prepare_data, sample_batch, val_windows
    from critbatch.model import GPT
    from critbatch.train import evaluate, resolve_device

    if micro_batches < 2:
        raise ConfigError(f"--micro-batches {micro_batches}: the estimator needs K >= 2 "
                          "micro-batches (the reference uses 128)")
    if micro_batch_size < 1:
        raise ConfigError(f"--micro-batch-size {micro_batch_size} must be at least 1")
    cfg, state, step = load_checkpoint(run_dir)
    cfg.train.device = device_name
    if cache_dir:
        cfg.data.cache_dir = cache_dir
    device, amp_dtype, _ = resolve_device(cfg)
    use_amp = amp_dtype != torch.float32
    autocast = torch.autocast(device.type, dtype=amp_dtype) if use_amp else torch.autocast(
        device.type, enabled=False)
    m, t = cfg.model, cfg.train
    data = prepare_data(cfg.data)
    needed = micro_batch_size * (m.seq_len + 1)
    if needed > data.train.size:
        raise DataError(
            f"--micro-batch-size {micro_batch_size} needs {needed:,} distinct train tokens "
            f"(b x (seq_len + 1)) but the corpus has {data.train.size:,}; lower it"
        )
    seed = t.seed if seed is None else seed
    k, b = micro_batches, micro_batch_size
    t0 = time.perf_counter()
    model = GPT(m, cfg.data.vocab_size).to(device)
    model.load_state_dict(state)
    windows = sample_batch(data.train, m.seq_len, k * b, seed, step)  # (K b, T+1)
    gradients = micro_batch_gradients(model, windows.split(b), device, autocast)
    est = estimate(group_sums(gradients, min(k, JACKKNIFE_GROUPS)), b)
    val = val_windows(data.val, m.seq_len, t.eval_tokens)
    val_loss = evaluate(model, val, max(b, t.micro_batch_size or t.batch_size), device,
                        autocast)
    bpt = data.bytes_per_token
    summary_path = run_dir / "summary.json"
    online = runs.read_summary(run_dir).get("b_noise") if summary_path.exists() else None
    def tokens_or_none(x: float | None) -> float | None:
        return None if x is None else x * m.seq_len

    record = {
        "schema_version": runs.SCHEMA_VERSION,
        "step": step,
        "tokens": step * t.batch_size * m.seq_len,
        "seq_len": m.seq_len,
        "micro_batches": k,
        "micro_batch_size": b,
        "val_loss": val_loss,
        "val_loss_per_byte": val_loss / bpt,
        "g2": est.g2,
        "trace": est.trace,
        "b_noise": est.b_noise,
        "b_noise_tokens": tokens_or_none(est.b_noise),
        "b_noise_low": est.b_noise_low,
        "b_noise_high": est.b_noise_high,
        "resolved": est.b_noise is not None,
        # beyond the required keys
        "loss": est.loss,  # on the K b measured windows (train split), nats/token
        "loss_per_byte": est.loss / bpt,
        "g2_stderr": est.g2_stderr,
        "trace_stderr": est.trace_stderr,
        "b_noise_tokens_low": tokens_or_none(est.b_noise_low),
        "b_noise_tokens_high": tokens_or_none(est.b_noise_high),
        "interval": f"68%: jackknife over {est.groups} groups of micro-batches, log B_noise",
        "online_b_noise": online,
        "width": m.width,
        "seed": seed,
        "device": str(device),
        "dtype": str(amp_dtype).removeprefix("torch."),
        "wall_time_s": time.perf_counter() - t0,
        "git_revision": runs.git_revision(),
    }
    runs.write_json_atomic(run_dir / "noise.json", record)
    print(TABLE_HEADER)
    print(table_row(record))
    _log_wandb(cfg, wandb_group(cfg), run_dir, record)
    return record


TABLE_HEADER = ("| model | loss (nats/byte) | tr(Sigma) | abs(G)^2 | B_noise | micro-batches |\n"
                "|---|---|---|---|---|---|")


def table_row(r: dict) -> str:
    """One row in the form of science.md's reference table (plus K x b)."""
    if r["resolved"]:
        b_noise = f"{r['b_noise']:,.0f} sequences ({_si(r['b_noise_tokens'])} tokens)"
        if r["b_noise_low"] is not None:
            b_noise += f", 68%: {r['b_noise_low']:,.0f}-{r['b_noise_high']:,.0f}"
        else:
            b_noise += ", 68%: unbounded above (increase K)"
    else:
        b_noise = "not resolved (abs(G)^2 <= 0), increase K"
    return (f"| width {r['width']}, {r['step']:,} steps | {r['val_loss_per_byte']:.3f} | "
            f"{r['trace']:#.3g} | {r['g2']:#.3g} | {b_noise} | "
            f"{r['micro_batches']} x {r['micro_batch_size']} |")


def _si(x: float) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def _log_wandb(cfg, group: str, run_dir: Path, record: dict) -> None:
    if cfg.logger.mode == "disabled":
        return
    import wandb

    numbers = {k: v for k, v in record.items()
               if isinstance(v, int | float) and not isinstance(v, bool)}
    with wandb.init(
        mode=cfg.logger.mode, project=cfg.logger.project, group=group, job_type="noise",
        name=f"noise-{run_dir.name}", dir=str(run_dir), config=record,
        settings=wandb.Settings(console="off", silent=True),
    ) as run:
        run.log(numbers)
        run.summary.update(numbers)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every critbatch error
        fail(f"{message} (see python -m critbatch.noise --help)")


def main(argv: list[str] | None = None) -> None:
    parser = _Parser(prog="python -m critbatch.noise",
                     description="Measure the gradient noise scale at a run's checkpoint.")
    parser.add_argument("run_dir", type=Path, help="a run directory holding checkpoint.pt")
    parser.add_argument("--micro-batches", "-K", type=int, default=128,
                        help="K micro-batches (default 128); the big batch is K x b")
    parser.add_argument("--micro-batch-size", "-b", type=int, default=4,
                        help="b sequences per micro-batch (default 4)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the drawn windows (default: the run's train.seed)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--cache-dir", default=None,
                        help="token cache folder (default: the run's data.cache_dir)")
    args = parser.parse_args(argv)
    with user_errors():
        measure_run(args.run_dir, args.micro_batches, args.micro_batch_size, args.seed,
                    args.device, args.cache_dir)


if __name__ == "__main__":
    sys.exit(main())
