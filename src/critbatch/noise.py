"""The gradient noise scale B_noise = tr(Sigma) / |G|^2, for any PyTorch loop.

`python -m critbatch.noise RUN_DIR` measures it at a critbatch run's checkpoint
(`critbatch.training.noise_program`). `NoiseTracker` (`critbatch.training.gns`) tracks it
online in a training loop of your own, from the gradients the loop computes anyway:

    tracker = NoiseTracker(model.parameters(), micro_batch_size=b)
    for batch in loader:
        for micro in batch.split(b):                 # k >= 2 micro-batches a step
            (loss_fn(model, micro) / k).backward()
            tracker.micro_batch()                    # this micro-batch's |g_b|^2
        tracker.step()                               # before clipping and the optimizer step
        optimizer.step(); optimizer.zero_grad()
    print(tracker.b_noise)                           # sequences (examples); None: unresolved

Under DDP each rank's gradient before the all-reduce is the small batch and the reduced one
the big batch: call `update(small_sq_norm, big_sq_norm, big=global_batch)` with the mean
of the ranks' |g_local|^2 instead (`micro_batch_size` = the per-rank batch). The estimator,
its EMA and its units are science/noise.py's (McCandlish et al. 2018, App. A).
"""

from __future__ import annotations

from critbatch.training.gns import NoiseTracker

__all__ = ["NoiseTracker", "main"]


def main(argv: list[str] | None = None) -> None:
    """`python -m critbatch.noise RUN_DIR`: B_noise at a run's checkpoint."""
    from critbatch.training.noise_program import main as program

    program(argv)


if __name__ == "__main__":
    main()
