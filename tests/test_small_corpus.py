"""Your own corpus, checked: a run that needs more tokens than the corpus gives says how many
passes it makes, and a val split shorter than train.eval_tokens is named (warnings, not errors),
in the run's stdout and in its train.log."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np

from critbatch.training import cli as train_module
from critbatch.training.data import coverage_warnings
from critbatch.training.token_cache import TokenData

SENTENCE = ("the batch noise scale grows as the loss falls so a larger batch pays later in "
            "training while early steps want small batches and many of them")


def tokens(train: int, val: int) -> TokenData:
    return TokenData(train=np.zeros(train, np.uint16), val=np.zeros(val, np.uint16),
                     manifest={}, directory=Path("."))


def test_passes_and_a_short_val_split_are_counted():
    assert coverage_warnings(tokens(10_000, 5_000), "text_files", 10_000, 4_096) == []
    passes, short_val = coverage_warnings(tokens(10_000, 1_000), "text_files", 35_000, 4_096)
    assert passes == ("warning: data=text_files has 10,000 train tokens, fewer than the run's "
                      "35,000: it makes 3.5 passes over the data (text repeats; a larger corpus "
                      "avoids it)")
    assert "has 1,000 val tokens, fewer than train.eval_tokens=4,096" in short_val


def write_corpus(folder: Path, n_files: int = 5, words: int = 400) -> None:
    rng = random.Random(0)
    folder.mkdir()
    for i in range(n_files):
        text = " ".join(rng.choice(SENTENCE.split()) for _ in range(words))
        (folder / f"doc{i}.txt").write_text(text + ".\n")


def test_a_run_on_a_small_corpus_says_so_in_stdout_and_train_log(tmp_path, monkeypatch,
                                                                  capsys):
    write_corpus(tmp_path / "corpus")
    run_dir = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", [
        "critbatch.train", "scale=smoke", "data=text_files",
        f"data.paths=[{tmp_path / 'corpus'}/*.txt]", f"data.cache_dir={tmp_path / 'cache'}",
        "data.vocab_size=512", "model.width=32", "model.heads=2", "model.depth=2",
        "model.seq_len=32", "logger.mode=disabled", "train.tokens=16384", "train.batch_size=8",
        "train.eval_points=2", "train.eval_tokens=4096", f"hydra.run.dir={run_dir}"])
    train_module.main()
    stdout = capsys.readouterr().out
    log = (run_dir / "train.log").read_text()
    for text in (stdout, log):
        (passes,) = [line for line in text.splitlines() if "passes over the data" in line]
        train_tokens = int(passes.split(" has ")[1].split(" train tokens")[0].replace(",", ""))
        assert train_tokens < 16_384
        assert f"{16_384 / train_tokens:.1f} passes" in passes
        assert "fewer than train.eval_tokens=4,096" in text
    assert (run_dir / "summary.json").exists()  # a warning, not an error
