"""A run's saved resolved config (config.json, a checkpoint) read back as a typed `Config`, also
when an older critbatch wrote it, and compared with the current config: what makes a run the
same run."""

from __future__ import annotations

from dataclasses import is_dataclass
from typing import Any

from omegaconf import OmegaConf

from critbatch.training.config import Config
from critbatch.training.config_checks import validate

IDENTITY_EXEMPT = ("logger", "train.device", "train.compile", "train.compile_backend",
                   "train.log_every", "data.cache_dir", "train.checkpoint_every_steps",
                   "train.checkpoint_every_minutes", "train.keep_checkpoint")


def config_differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two resolved configs (logging/device aside).

    A key missing from `old` is a field added to the schema after that run was made; it
    is not a difference (so finished runs stay valid when critbatch gains a setting).
    """
    keys = []
    for key in sorted(set(old) | set(new)):
        dotted = f"{prefix}{key}"
        if dotted in IDENTITY_EXEMPT or key not in old:
            continue
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += config_differences(a, b, f"{dotted}.")
        elif a != b:
            keys.append(dotted)
    return keys


RENAMED = {"wsd_decay_fraction": "cooldown_fraction"}  # train keys renamed since: old -> new


def renamed(saved: dict) -> dict:
    """A saved resolved config with the train keys renamed since (RENAMED) under their new
    names."""
    if "train" not in saved:
        return saved
    train = dict(saved["train"])
    for old, new in RENAMED.items():
        if old in train:
            train.setdefault(new, train.pop(old))
    return {**saved, "train": train}


def config_from_saved(saved: dict) -> Config:
    """The typed Config of a run's saved resolved config (config.json, a checkpoint), also
    when an older critbatch wrote it: renamed keys are mapped, retired keys dropped."""

    def known(values: dict, schema: Any) -> dict:
        out = {}
        for key, value in values.items():
            if not hasattr(schema, key):
                continue
            sub = getattr(schema, key)
            out[key] = known(value, sub) if isinstance(value, dict) and is_dataclass(sub) \
                else value
        return out

    merged = OmegaConf.merge(OmegaConf.structured(Config), known(renamed(saved), Config()))
    cfg = OmegaConf.to_object(merged)
    validate(cfg)
    return cfg


def run_differences(saved: dict, current: dict) -> list[str]:
    """Dotted keys in which a run's saved resolved config differs from `current` (both as
    dicts), leaving out the sweep grids (`grid`: only what a run trained with counts).
    Keys renamed since the run was saved (RENAMED) are compared under their new names."""
    saved = renamed(saved)
    return config_differences({k: v for k, v in saved.items() if k != "grid"},
                              {k: v for k, v in current.items() if k != "grid"})
