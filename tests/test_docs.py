"""The docs name only what exists: every `make` target, `python analysis/<name>.py` script and
config key they write must be real, and the README stays short with its answer near the top.

No training: the Makefile is parsed, the scripts looked up, and the keys resolved on the
default config as `python -m critbatch.train` composes it (`check_overrides([])`).
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from critbatch.training.cli import check_overrides

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
# the user docs: README and docs/*.md; results pages (docs/results/) record past commands
DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]
MAX_README_LINES = 160
RECOMMEND_HEADER_BY_LINE = 60
# the top-level groups of the config (training/config.py's Config) that hold keys
CONFIG_GROUPS = ("model", "data", "optim", "train", "logger", "grid")
# `train.log`, `model.py`, `data.md`: files, not keys
FILE_SUFFIXES = {"py", "md", "json", "jsonl", "yaml", "csv", "png", "log", "pt", "txt", "sha256"}
# the docs' example of a mistyped key, and what critbatch answers to it
MISTAKES = {"train.batch_sise"}


def code_spans(text: str) -> list[str]:
    """The text of every fenced code block and every inline `code span`."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S)
    rest = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.M | re.S)
    return fenced + re.findall(r"`([^`\n]+)`", rest)


def named_in_code(pattern: str) -> list[tuple[str, str]]:
    """(doc name, match) for every match of `pattern` inside the docs' code."""
    return sorted({(doc.relative_to(REPO).as_posix(), m)
                   for doc in DOCS for span in code_spans(doc.read_text())
                   for m in re.findall(pattern, span)})


def makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, flags=re.M))


@pytest.mark.parametrize(("doc", "target"), named_in_code(r"(?<![\w-])make ([a-z][\w-]*\*?)"))
def test_every_make_target_named_exists(doc, target):
    """`make sweep-*` stands for the targets it matches: at least one must exist."""
    targets = makefile_targets()
    found = (any(t.startswith(target[:-1]) for t in targets) if target.endswith("*")
             else target in targets)
    assert found, f"{doc} names `make {target}`, not in the Makefile"


@pytest.mark.parametrize(("doc", "name"), named_in_code(r"python3? analysis/(\w+)\.py"))
def test_every_analysis_script_named_exists(doc, name):
    assert (REPO / "analysis" / f"{name}.py").is_file(), f"{doc} names analysis/{name}.py"


def config_keys(text: str) -> list[str]:
    """Dotted keys of the config groups written in code, as `key.sub=value` or `key.sub`;
    `model.{width,depth}` expands to both. A name preceded by `.`, `/` or a word character
    (`critbatch.train`, `docs/data.md`) is no key."""
    keys = []
    group = "|".join(CONFIG_GROUPS)
    for span in code_spans(text):
        for m in re.finditer(rf"(?<![\w./<-])((?:{group})(?:\.[a-z_]+)*)\.\{{([a-z_,]+)\}}",
                             span):
            keys += [f"{m.group(1)}.{name}" for name in m.group(2).split(",")]
        for m in re.finditer(rf"(?<![\w./<-])((?:{group})(?:\.[a-z_0-9]+)+)(?![\w{{<.])", span):
            key = m.group(1)
            if key.rsplit(".", 1)[1] not in FILE_SUFFIXES:
                keys.append(key)
    return keys


def resolves(cfg, key: str) -> bool:
    """Whether `key` names a field (or a dict entry) of the composed config."""
    node = cfg
    for part in key.split("."):
        if dataclasses.is_dataclass(node) and part in {f.name for f in dataclasses.fields(node)}:
            node = getattr(node, part)
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return False
    return True


DOC_KEYS = sorted({(doc.relative_to(REPO).as_posix(), key)
                   for doc in DOCS for key in config_keys(doc.read_text())
                   if key not in MISTAKES})


def test_the_key_finder_reads_what_the_docs_write():
    found = config_keys("`train.batch_size=64`, `model.{width,depth}`, `logger.mode`\n"
                        "```\nmake train ARGS=\"optim.lr=2e-3 grid.lrs.adamw='1e-3'\"\n```\n"
                        "`train.log`, `docs/data.md`, `critbatch.train`, `joint.<opt>.verdict`")
    assert sorted(found) == ["grid.lrs.adamw", "logger.mode", "model.depth", "model.width",
                             "optim.lr", "train.batch_size"]
    assert ("README.md", "train.batch_size") in DOC_KEYS


@pytest.mark.parametrize(("doc", "key"), DOC_KEYS)
def test_every_config_key_named_resolves(doc, key):
    assert resolves(default_config(), key), f"{doc} names `{key}`, not a key of the config"


_CONFIG = []


def default_config():
    if not _CONFIG:
        _CONFIG.append(check_overrides([]))
    return _CONFIG[0]


def test_readme_is_short_and_answers_early():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines"
    headers = [i for i, line in enumerate(lines, 1)
               if line.startswith("## ") and "answer for your run" in line.lower()]
    assert headers and headers[0] <= RECOMMEND_HEADER_BY_LINE, headers
    first = "\n".join(lines[:15])
    assert "make sweep-batch" in first and "make test" in first


def test_readme_names_no_commit():
    hashes = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", README.read_text())
              if re.search(r"[a-f]", w) and re.search(r"[0-9]", w)]
    assert not hashes, f"README.md names commits {hashes}"


@pytest.mark.slow
def test_the_noise_tracker_example_runs_as_written():
    """docs/running.md's NoiseTracker loop, run as it stands: it prints a B_noise."""
    text = (REPO / "docs" / "running.md").read_text()
    section = text.split("### B_noise in your own loop", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(code.strip().splitlines()) <= 20
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("B_noise ") and float(proc.stdout.split()[1]) > 0
