"""The studies `python -m critbatch.sweep` runs (`EXPERIMENTS`): each one's stages in order
(sweeps/<stage>.yaml), its analysis script, and the stages that tune the lr, hold the noise
measurement and hold the report; and where the repository's sweeps/ and analysis/ are."""

from __future__ import annotations

from dataclasses import dataclass

from critbatch.training import config as schema

REPO = schema.CONF_DIR.parent
SWEEPS_DIR = REPO / "sweeps"
ANALYSIS_DIR = REPO / "analysis"


@dataclass(frozen=True)
class Experiment:
    stages: tuple[str, ...]  # sweeps/<stage>.yaml, run in this order
    analysis: str  # analysis/<script> over the stages' folders
    noise_stage: str | None = None  # its largest-budget run gets the offline B_noise
    tuning_stage: str | None = None  # the later stages train at its best optim.lr
    middle_lr: bool = False  # the stages train at the middle lr of the batch grid (grid.lrs)
    report: str = ""  # the stage whose folder holds the report (runs/<it>/<scale>/report)
    # an experiment whose report the analysis draws for comparison when it exists at the same
    # scale (passed as --batch-sweep runs/<it>/<scale>)
    compare_with: str | None = None
    # the stage whose lrs the adaptive lr search extends (`grid.lr_search`; lr_search.py)
    lr_search_stage: str | None = None
    wandb: bool = True  # the analysis logs its report to W&B (and takes --wandb)

    @property
    def report_stage(self) -> str:
        return self.report or self.stages[-1]


EXPERIMENTS = {
    "batch": Experiment(("batch", "batch_seeds"), "fit_bcrit.py", noise_stage="batch",
                        report="batch", lr_search_stage="batch"),
    "widths": Experiment(("widths", "widths_seeds"), "fit_bcrit.py", noise_stage="widths",
                         report="widths", lr_search_stage="widths"),
    "stability": Experiment(("stability_lr", "stability", "stability_accum"), "stability.py",
                            tuning_stage="stability_lr", report="stability"),
    "schedules": Experiment(("schedules",), "schedules.py"),
    "branches": Experiment(("batch", "branch_check"), "branch_check.py", tuning_stage="batch",
                           report="branch_check", wandb=False),
    "local_cbs": Experiment(("local_cbs",), "local_cbs.py", middle_lr=True,
                            compare_with="batch"),
}
