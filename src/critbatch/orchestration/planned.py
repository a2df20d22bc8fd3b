"""A planned run of a sweep (`Job`): its config and folder, and what that folder holds so far.

`stages.plan_stage` makes one per run of a stage's multirun, named and configured exactly as
Hydra would; the sweep's workers (`pool`), SLURM array tasks (`slurm`) and
the report all judge a run by its folder alone (summary.json, branches, failed.txt), so any
process that sees the folder can tell what is left.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from critbatch.results import runs
from critbatch.results.errors import ResultsError
from critbatch.science.model_size import flops_per_token
from critbatch.training import branches as branching
from critbatch.training import config as schema
from critbatch.training import failures
from critbatch.training.config import Config
from critbatch.training.saved_config import run_differences


@dataclass
class Job:
    stage: str
    optimizer: str
    overrides: list[str]  # the job's task overrides, as a Hydra multirun job gets (no hydra.*)
    run_dir: Path
    cfg: Config
    extra: list[str] = field(default_factory=list)  # the stage's own overrides (tuned lr, ...)
    search_round: int = 0  # 0: the stage's grid; n: an lr the lr search added in round n

    @property
    def finished(self) -> bool:
        """The run itself holds a valid summary.json (its branches aside)."""
        try:
            runs.read_summary(self.run_dir)
            return True
        except ResultsError:
            return False

    @property
    def branches(self) -> list[branching.Branch]:
        return branching.plan_branches(self.cfg, self.run_dir, self.overrides)

    @property
    def done(self) -> bool:
        """The run and every branch it can have are finished."""
        return self.finished and not branching.pending(self.cfg, self.run_dir, self.overrides)

    @property
    def tokens_to_train(self) -> int:
        """Tokens still to train: the run (unless finished), its branches after their forks."""
        left = 0 if self.finished else self.tokens
        return left + sum(b.tokens - b.fork_tokens for b in self.branches if not b.done)

    @property
    def differences(self) -> list[str]:
        """Keys in which the finished run already in `run_dir` differs from this job's config
        (a grid changed since it was trained); empty when none is there or they agree."""
        saved = runs.read_config(self.run_dir) if self.done else None
        return run_differences(saved, asdict(self.cfg)) if saved else []

    @property
    def tokens(self) -> int:
        return schema.token_budget(self.cfg)

    @property
    def flops_to_train(self) -> int:
        """Training FLOPs still to do (`tokens_to_train` x 6N + attention): the relative cost of
        a job where its seconds were not measured (a SLURM sweep times nothing on the login
        node)."""
        m = self.cfg.model
        return self.tokens_to_train * flops_per_token(m.width, m.depth, m.seq_len,
                                                      self.cfg.data.vocab_size)

    @property
    def failure(self) -> str | None:
        """Why the run, or one of its branches still to train, failed, as recorded in its
        folder (`failures.record`); None when nothing is recorded."""
        folders = [self.run_dir, *(b.run_dir for b in self.branches if not b.done)]
        return next((why for d in folders if (why := failures.reason(d))), None)
