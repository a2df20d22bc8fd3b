"""The config's checks: a composed DictConfig resolved into the typed `Config` and validated
(relations between fields that types alone cannot state), and Hydra/OmegaConf's exceptions
turned into one-line messages. The schema itself is training/config.py."""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import is_dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf, errors

from critbatch.results.errors import ConfigError
from critbatch.training.config import (
    CONF_DIR,
    MAX_VOCAB,
    BatchSchedule,
    Config,
    is_power_of_two,
    micro_batch_size,
    total_steps,
)
from critbatch.training.measured import read_curve


def _positive(key: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{key}={value} must be positive")


def validate(cfg: Config) -> None:
    """Check the relations between fields that types alone cannot; raise ConfigError."""
    m, t, o, d = cfg.model, cfg.train, cfg.optim, cfg.data
    for key, value in [
        ("model.width", m.width), ("model.depth", m.depth), ("model.heads", m.heads),
        ("model.seq_len", m.seq_len), ("train.batch_size", t.batch_size),
        ("optim.lr", o.lr), ("optim.base_batch_size", o.base_batch_size),
        ("train.eval_points", t.eval_points), ("train.eval_tokens", t.eval_tokens),
        ("data.vocab_size", d.vocab_size), ("train.log_every", t.log_every),
    ]:
        _positive(key, value)
    if t.tokens <= 0:
        raise ConfigError(f"train.tokens={t.tokens} must be a positive token budget")
    if m.width % m.heads:
        raise ConfigError(
            f"model.heads={m.heads} does not divide model.width={m.width}; "
            f"choose heads among {[h for h in range(1, m.width + 1) if m.width % h == 0][:8]}"
        )
    _validate_batch_schedule(cfg)
    # per-step decays (Adam's beta2, Muon's momentum) and the rule that carries each to the
    # batch: set once, for the first batch, so a changing batch would not be followed
    for key, value, rule in (("beta2", o.beta2, o.beta2_scaling),
                             ("momentum", o.momentum, o.momentum_scaling)):
        if not 0 <= value < 1:
            raise ConfigError(f"optim.{key}={value} must lie in [0, 1) (e.g. 0.95)")
        if rule == "tokens" and t.batch_schedule != "constant":
            raise ConfigError(
                f"optim.{key}_scaling=tokens with train.batch_schedule={t.batch_schedule}: "
                f"{key} is set once, for the first batch, and would not follow the schedule; "
                f"set optim.{key}_scaling=none (and optim.{key} for the run)")
    micro = micro_batch_size(cfg)
    if micro <= 0 or t.batch_size % micro:
        raise ConfigError(
            f"train.batch_size={t.batch_size} is not a multiple of "
            f"train.micro_batch_size={micro}; set a micro-batch size that divides it"
        )
    tokens_per_step = t.batch_size * m.seq_len
    if t.batch_schedule == "constant" and t.steps is None and t.tokens < tokens_per_step:
        raise ConfigError(
            f"train.tokens={t.tokens} is less than one step "
            f"(batch_size x seq_len = {tokens_per_step} tokens); raise train.tokens"
        )
    if d.vocab_size > MAX_VOCAB:
        raise ConfigError(
            f"data.vocab_size={d.vocab_size} exceeds {MAX_VOCAB} (token ids are stored as "
            "uint16); choose a smaller vocabulary"
        )
    if d.vocab_size < 260:
        raise ConfigError(
            f"data.vocab_size={d.vocab_size} is below the 256 byte tokens plus specials; "
            "use at least 260"
        )
    for key in ("checkpoint_every_steps", "checkpoint_every_minutes"):
        if getattr(t, key) is not None and not getattr(t, key) > 0:
            raise ConfigError(f"train.{key}={getattr(t, key)} must be positive (or null: never "
                              "by that measure)")
    if t.warmup_steps < 0:
        raise ConfigError(f"train.warmup_steps={t.warmup_steps} must be >= 0")
    if not 0 <= t.min_lr_ratio <= 1:
        raise ConfigError(f"train.min_lr_ratio={t.min_lr_ratio} must lie in [0, 1]")
    if not 0 < t.cooldown_fraction <= 1:
        raise ConfigError(f"train.cooldown_fraction={t.cooldown_fraction} must lie in (0, 1]")
    if t.micro_batches < 1:
        raise ConfigError(f"train.micro_batches={t.micro_batches} must be >= 1")
    _validate_branches(cfg)
    _validate_data_chunk(cfg)
    _validate_local_cbs(cfg)
    if not 0 <= t.gns.ema < 1:
        raise ConfigError(f"train.gns.ema={t.gns.ema} must lie in [0, 1) (e.g. 0.95)")
    if not 0 < d.val_fraction < 0.5:
        raise ConfigError(f"data.val_fraction={d.val_fraction} must lie in (0, 0.5)")
    if t.steps is not None and t.steps < 1:
        raise ConfigError(f"train.steps={t.steps} must be >= 1 (or null: from train.tokens)")
    if not (t.device in ("auto", "cpu") or t.device.startswith("cuda")):
        raise ConfigError(f"train.device={t.device} is not auto, cpu, cuda or cuda:N")
    if d.hf_revision is not None and not re.fullmatch(r"[\w.\-/]+", d.hf_revision):
        raise ConfigError(f"data.hf_revision={d.hf_revision!r} is not a commit sha, tag or branch "
                          "name; give one (e.g. data.hf_revision=main) or null")
    if d.name == "text_files" and not d.paths:
        raise ConfigError("data=text_files needs data.paths, e.g. data.paths='[corpus/*.txt]'")


def _validate_branches(cfg: Config) -> None:
    t = cfg.train
    if not t.branch_budgets:
        return
    fractions = list(t.branch_budgets)
    if t.schedule != "wsd":
        raise ConfigError(f"train.branch_budgets={fractions} needs train.schedule=wsd (a branch "
                          f"forks off the constant phase); {t.schedule} has none")
    if t.batch_schedule != "constant" or t.steps is not None:
        raise ConfigError("train.branch_budgets needs a constant batch and a token budget "
                          "(train.batch_schedule=constant, train.steps=null)")
    if any(not 0 < f < 1 for f in fractions) or sorted(set(fractions)) != fractions:
        raise ConfigError(f"train.branch_budgets={fractions} must be increasing fractions of "
                          "the budget in (0, 1), e.g. [0.125,0.25,0.5]")
    smallest = fractions[0] * t.tokens // (t.batch_size * cfg.model.seq_len)
    if smallest < 1:
        raise ConfigError(f"train.branch_budgets: {fractions[0]} of train.tokens={t.tokens} is "
                          "less than one step; raise train.tokens or the fraction")


def _validate_batch_schedule(cfg: Config) -> None:
    t = cfg.train
    if t.batch_schedule == "constant":
        return
    name = f"train.batch_schedule={t.batch_schedule}"
    if t.steps is not None:
        raise ConfigError(f"{name} takes a token budget (train.tokens), not train.steps; "
                          "set train.steps=null")
    if t.batch_size_start is None:
        raise ConfigError(f"{name} needs train.batch_size_start (the first batch, sequences)")
    start, end, micro = t.batch_size_start, t.batch_size, micro_batch_size(cfg)
    if not 0 < start <= end:
        raise ConfigError(f"train.batch_size_start={start} must lie in [1, train.batch_size={end}]")
    if t.batch_schedule == "switch":
        _validate_switch(cfg)
        return
    for key, value in (("train.batch_size_start", start), ("train.batch_size", end)):
        if value % micro or not is_power_of_two(value // micro):
            raise ConfigError(
                f"{key}={value} is not a power of two times train.micro_batch_size={micro}; "
                f"{name} changes the batch in doublings of the micro-batch"
            )
    if t.tokens < start * cfg.model.seq_len:
        raise ConfigError(f"train.tokens={t.tokens} is less than one step of "
                          f"train.batch_size_start={start}; raise train.tokens")
    if not 0 < t.ramp_fraction <= 1:
        raise ConfigError(f"train.ramp_fraction={t.ramp_fraction} must lie in (0, 1]")
    if t.batch_schedule == "adaptive":
        if not t.gns.enabled:
            raise ConfigError("train.batch_schedule=adaptive follows the online B_noise; "
                              "set train.gns.enabled=true")
        if start < 2 * micro:
            fix = (f"set train.micro_batch_size={start // 2}" if start >= 2 else
                   "raise train.batch_size_start to 2 or more")
            raise ConfigError(
                f"train.batch_schedule=adaptive measures B_noise from >= 2 micro-batches a step, "
                f"but train.batch_size_start={start} is one micro-batch of {micro}; {fix}"
            )
        if t.adaptive.interval_steps < 1:
            raise ConfigError(f"train.adaptive.interval_steps={t.adaptive.interval_steps} "
                              "must be >= 1")
        _positive("train.adaptive.noise_factor", t.adaptive.noise_factor)
    if t.batch_schedule == "measured":
        _positive("train.measured.factor", t.measured.factor)
        read_curve(t.measured.fits, cfg.optim.name, cfg.optim.lr_scaling, cfg.scale)


def _validate_switch(cfg: Config) -> None:
    t, micro = cfg.train, micro_batch_size(cfg)
    start, end, at = t.batch_size_start, t.batch_size, t.switch_at_tokens
    for key, value in (("train.batch_size_start", start), ("train.batch_size", end)):
        if value % micro:
            raise ConfigError(f"{key}={value} is not a multiple of train.micro_batch_size={micro}; "
                              "train.batch_schedule=switch accumulates whole micro-batches")
    if at is None or at < 0 or at % (start * cfg.model.seq_len):
        raise ConfigError(
            f"train.batch_schedule=switch needs train.switch_at_tokens (now {at}), a whole number "
            f"of first steps of {start} x {cfg.model.seq_len} tokens, e.g. "
            f"{10 * start * cfg.model.seq_len}")
    if t.tokens < at + end * cfg.model.seq_len:
        raise ConfigError(f"train.tokens={t.tokens} leaves no step of train.batch_size={end} after "
                          f"train.switch_at_tokens={at}; raise train.tokens")


def _validate_data_chunk(cfg: Config) -> None:
    t, chunk = cfg.train, cfg.train.data_chunk
    if chunk is None:
        return
    if chunk < 1:
        raise ConfigError(f"train.data_chunk={chunk} must be >= 1 sequence (or null)")
    if t.batch_schedule in ("ramp", "adaptive", "measured") and micro_batch_size(cfg) % chunk:
        raise ConfigError(f"train.data_chunk={chunk} must divide the micro-batch "
                          f"({micro_batch_size(cfg)}) of train.batch_schedule={t.batch_schedule}, "
                          "whose batches are multiples of it")
    for key in ("batch_size", "batch_size_start") if t.batch_schedule == "switch" else (
            "batch_size",):
        if getattr(t, key) % chunk:
            raise ConfigError(f"train.{key}={getattr(t, key)} is not a multiple of "
                              f"train.data_chunk={chunk}; a step is a whole number of chunks")


def _validate_local_cbs(cfg: Config) -> None:
    t, local = cfg.train, cfg.train.local_cbs
    fractions, ks = list(local.at_fractions), list(local.multipliers)
    if not fractions:
        return
    if t.batch_schedule != "constant" or t.steps is not None or t.schedule != "constant":
        raise ConfigError("train.local_cbs.at_fractions needs a constant batch, a constant lr "
                          "and a token budget (train.batch_schedule=constant, "
                          "train.schedule=constant, train.steps=null): branches measure at the "
                          "run's lr")
    if t.branch_budgets:
        raise ConfigError("train.local_cbs.at_fractions and train.branch_budgets cannot both be "
                          "set (constant lr vs wsd); train them as two runs")
    if any(not 0 < f < 1 for f in fractions) or sorted(set(fractions)) != fractions:
        raise ConfigError(f"train.local_cbs.at_fractions={fractions} must be increasing fractions "
                          "of the budget in (0, 1), e.g. [0.03,0.06,0.12,0.25,0.5,0.8]")
    if not ks or ks[0] != 1 or any(b != 2 * a for a, b in zip(ks, ks[1:], strict=False)):
        raise ConfigError(f"train.local_cbs.multipliers={ks} must be ascending powers of two "
                          "starting at 1, e.g. [1,2,4,8,16]")
    if len(ks) < 2:
        raise ConfigError("train.local_cbs.multipliers=[1] has nothing to compare; add 2, 4, ...")
    if any(s == t.seed for s in local.replicate_seeds) or len(set(local.replicate_seeds)) != len(
            local.replicate_seeds):
        raise ConfigError(f"train.local_cbs.replicate_seeds={list(local.replicate_seeds)} must be "
                          f"distinct seeds other than train.seed={t.seed}")
    if not 0 <= local.cooldown_fraction <= 1:
        raise ConfigError(f"train.local_cbs.cooldown_fraction={local.cooldown_fraction} must lie "
                          "in [0, 1] (a share of the window; 0 = constant lr)")
    if t.data_chunk not in (None, t.batch_size):
        raise ConfigError(f"train.data_chunk={t.data_chunk}: local branches draw chunks of the "
                          f"base batch; set it to train.batch_size={t.batch_size} or null")
    largest = ks[-1] * t.batch_size * cfg.model.seq_len  # tokens of the largest branch's step
    if local.window_tokens < largest:
        raise ConfigError(f"train.local_cbs.window_tokens={local.window_tokens} is less than one "
                          f"step of the largest branch ({ks[-1]} x {t.batch_size} x "
                          f"{cfg.model.seq_len} = {largest} tokens); raise it")
    step_tokens = t.batch_size * cfg.model.seq_len
    first = int(fractions[0] * total_steps(cfg))
    if first < max(1, t.warmup_steps):
        raise ConfigError(f"train.local_cbs.at_fractions: the first fork, {fractions[0]} of the "
                          f"budget, is at step {first}, inside the {t.warmup_steps}-step warmup; "
                          f"the branches measure at the peak lr: raise the fraction or "
                          f"train.tokens (now {t.tokens}, {step_tokens} tokens a step)")
    steps = [int(f * total_steps(cfg)) for f in fractions]
    if len(set(steps)) != len(steps):
        raise ConfigError(f"train.local_cbs.at_fractions={fractions} give the same fork step "
                          f"twice (of {total_steps(cfg)} steps); spread them or raise train.tokens")


def to_config(cfg: DictConfig) -> Config:
    """Resolve a composed DictConfig into the typed `Config` and validate it."""
    extra = _extra_keys(OmegaConf.to_container(cfg), Config())
    if extra:
        raise ConfigError(_unknown_key_message(extra[0]))
    obj = OmegaConf.to_object(cfg)
    if not isinstance(obj, Config):  # composed without the schema (should not happen)
        raise ConfigError("config is missing the critbatch schema; keep `critbatch_schema` "
                          "first in conf/config.yaml's defaults")
    resolve_warmup(obj)
    validate(obj)
    return obj


def resolve_warmup(cfg: Config) -> None:
    """Apply `train.warmup_tokens`, when set: `train.warmup_steps` becomes the larger of itself
    and the warmup tokens in this run's steps. A small batch then warms up over as many tokens
    as a larger one (a step warmup alone gives it fewer, and AdamW's high lrs need them), a
    large batch over at least warmup_steps steps (fewer made AdamW collapse at large batch,
    science.md section 3)."""
    t = cfg.train
    if t.warmup_tokens is None:
        return
    if t.warmup_tokens < 0:
        raise ConfigError(f"train.warmup_tokens={t.warmup_tokens} must be >= 0 (or null: "
                          "train.warmup_steps alone)")
    if t.batch_schedule != BatchSchedule.constant:
        raise ConfigError(f"train.warmup_tokens is for a constant batch; with "
                          f"train.batch_schedule={t.batch_schedule} set train.warmup_tokens=null "
                          "and the warmup in train.warmup_steps")
    step_tokens = t.batch_size * cfg.model.seq_len
    if step_tokens <= 0 or t.warmup_steps < 0:  # validate says what is wrong
        return
    t.warmup_steps = max(t.warmup_steps, math.ceil(t.warmup_tokens / step_tokens))


def _extra_keys(values: dict, schema: Any, prefix: str = "") -> list[str]:
    """Keys present in `values` but not declared in the dataclass `schema` (e.g. from `+key=`)."""
    extra = []
    for key, value in values.items():
        if not hasattr(schema, key):
            extra.append(prefix + key)
        elif isinstance(value, dict) and is_dataclass(getattr(schema, key)):
            extra += _extra_keys(value, getattr(schema, key), f"{prefix}{key}.")
    return extra


# ---------------------------------------------------------------------------
# Turning Hydra/OmegaConf exceptions into one-line messages.


def _valid_keys(node: Any) -> list[str]:
    if node is None:
        return []
    return [k for k in OmegaConf.to_container(OmegaConf.structured(node))]


def _unknown_key_message(full_key: str) -> str:
    parts = full_key.split(".")
    node: Any = Config()
    for part in parts[:-1]:
        node = getattr(node, part, None)
    keys = _valid_keys(node)
    hint = difflib.get_close_matches(parts[-1], keys, n=1)
    prefix = ".".join(parts[:-1])
    if hint:
        suggestion = f"{prefix}.{hint[0]}" if prefix else hint[0]
        return f"unknown config key '{full_key}'; did you mean '{suggestion}'?"
    where = f" in '{prefix}'" if prefix else ""
    return f"unknown config key '{full_key}'; valid keys{where}: {', '.join(keys)}"


def explain_compose_error(err: BaseException) -> str:
    """A one-line explanation of why Hydra could not compose the config."""
    chain: list[BaseException] = []
    cur: BaseException | None = err
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    for exc in chain:
        key = getattr(exc, "full_key", None)
        if isinstance(exc, errors.ConfigAttributeError | errors.ConfigKeyError) and key:
            return _unknown_key_message(key)
        if isinstance(exc, errors.ValidationError):
            first = str(exc).splitlines()[0]
            choice = re.match(r"Invalid value '(.*)', expected one of \[(.*)\]", first)
            if choice:
                return (f"{key}={choice.group(1)} is not one of {choice.group(2)}; pick one of "
                        "those")
            return f"bad value for '{key}': {first}; give a value of the declared type"
        if isinstance(exc, errors.OmegaConfBaseException):
            return str(exc).splitlines()[0]
    head = (str(err).splitlines() or [type(err).__name__])[0]
    missing = re.search(r"Could not find '([^/']+)/([^']+)'", head)
    if missing:
        group, option = missing.groups()
        options = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
        return f"{group}={option} is not a config option; choose one of {', '.join(options)}"
    return head
