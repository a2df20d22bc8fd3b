"""`make data` / `python -m critbatch.data prepare`: the token cache of a hub corpus is built once
online and then read offline; the offline error names the command that works; pinned revisions
key the cache; a failed load leaves no lock file; data=hub streams a bounded number of documents.

No test touches the network: the hub is local parquet files behind a patched
`datasets.load_dataset`, and "offline" is a closed port or HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
from huggingface_hub import constants

from critbatch import data as data_command
from critbatch.results.errors import ConfigError, DataError
from critbatch.training import corpus as corpus_module
from critbatch.training import progress as progress_module
from critbatch.training import token_cache as cache_module
from critbatch.training.cli import check_overrides
from critbatch.training.config import DataConfig
from critbatch.training.corpus import cache_entry, cache_key, load_hub_documents
from critbatch.training.token_cache import prepare_data

HUB_IS_REACHABLE = corpus_module.hub_unreachable_reason  # the real probe, restored by hub_goes_away


@pytest.fixture
def fake_hub(monkeypatch, corpus_dir, tmp_path) -> list[dict]:
    """The hub, served from a local parquet file; returns the load_dataset calls it answered."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "hub.parquet"
    texts = [p.read_text() for p in sorted(corpus_dir.glob("*.txt"))]
    pq.write_table(pa.table({"text": texts}), path)
    real = datasets.load_dataset
    calls: list[dict] = []

    def load_dataset(hf_path, hf_name=None, **kwargs):
        calls.append({"path": hf_path, "name": hf_name, **kwargs})
        kwargs.pop("revision")
        return real("parquet", **{**kwargs, "data_files": [str(path)]})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(corpus_module, "hub_unreachable_reason", lambda timeout_s=5.0: None)
    return calls


def hub_goes_away(monkeypatch) -> None:
    """Nothing listens at the hub's address, and any call to load_dataset fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("load_dataset was called although the token cache exists")

    monkeypatch.setattr(corpus_module, "hub_unreachable_reason", HUB_IS_REACHABLE)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(datasets, "load_dataset", refuse)


def test_prepare_builds_the_cache_online_and_training_then_loads_it_offline(
        fake_hub, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(progress_module, "PROGRESS_EVERY_S", 0.0)  # a progress line per document
    overrides = [f"data.cache_dir={tmp_path / 'cache'}", "data.max_documents=20",
                 "data.vocab_size=300"]
    data_command.main(["prepare", "tinystories", *overrides])
    out, err = capsys.readouterr()
    pinned = check_overrides(["data=tinystories"]).data.hf_revision
    assert re.fullmatch(r"[0-9a-f]{40}", pinned)
    assert [(c["path"], c["revision"], c["streaming"]) for c in fake_hub] == [
        ("roneneldan/TinyStories", pinned, True)]
    assert "streaming roneneldan/TinyStories: 20/20 documents" in err
    assert "BPE pre-tokenising: " in err and "BPE tokenizer trained in" in err
    assert "encoding the train split: " in err
    _, directory = cache_entry(check_overrides(["data=tinystories", *overrides]).data, None)
    assert f"cached in {directory}" in out and "offline" in out

    hub_goes_away(monkeypatch)
    cfg = check_overrides(["data=tinystories", *overrides])  # what training composes
    tokens = prepare_data(cfg.data)
    assert tokens.directory == directory
    assert tokens.manifest["documents"] == 20 and tokens.manifest["hf_revision"] == pinned
    assert tokens.train.size > 1000 and tokens.val.size > 0


def test_offline_without_a_cache_names_the_command_that_builds_it(monkeypatch, tmp_path):
    hub_goes_away(monkeypatch)
    cache = tmp_path / "cache"
    cfg = check_overrides(["data=tinystories", "scale=gpu", "data.max_documents=500",
                           f"data.cache_dir={cache}"]).data
    with pytest.raises(DataError) as caught:
        prepare_data(cfg)
    message = str(caught.value)
    _, directory = cache_entry(cfg, None)
    assert "\n" not in message and "127.0.0.1:9 is unreachable" in message
    assert "HF_HUB_OFFLINE=1" not in message
    assert f"copy the folder {directory.name} from one that has it into {cache}" in message
    assert "training runs offline from critbatch's token cache" in message
    assert not cache.exists()  # checked before the lock: no lock file, no folder
    # the command in the message builds exactly the entry that is missing
    command = re.search(r"`make data DATA=(\w+) ARGS=\"([^\"]*)\"`", message)
    assert command is not None and command.group(1) == "tinystories"
    rebuilt = check_overrides(["data=tinystories", *shlex.split(command.group(2))]).data
    assert cache_entry(rebuilt, None) == cache_entry(cfg, None)


def test_prepare_command_offline_is_one_line_exit_2_and_creates_nothing(tmp_path):
    cache = tmp_path / "cache"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "critbatch.data", "prepare", "fineweb_edu",
         f"data.cache_dir={cache}"], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("critbatch: error: data=fineweb_edu has no")
    assert "make data DATA=fineweb_edu" in lines[0]
    assert not cache.exists()


def test_the_revision_keys_the_cache(fake_hub, tmp_path):
    def cfg(revision):
        return DataConfig(name="hub", hf_path="some/corpus", hf_revision=revision,
                          max_documents=30, vocab_size=300, cache_dir=str(tmp_path / "cache"))

    keys = {cache_key(cfg(r), None) for r in (None, "main", "a" * 40, "b" * 40)}
    assert len(keys) == 4
    assert cache_key(cfg(None), None) == "6aacd6c23c860f35"  # unpinned: the key before revisions
    first, second = prepare_data(cfg("a" * 40)), prepare_data(cfg("b" * 40))
    assert [c["revision"] for c in fake_hub] == ["a" * 40, "b" * 40]  # no reuse across revisions
    assert first.directory != second.directory
    assert (first.manifest["hf_revision"], second.manifest["hf_revision"]) == ("a" * 40, "b" * 40)
    prepare_data(cfg("a" * 40))  # the same revision again: read from its cache
    assert len(fake_hub) == 2


def test_a_revision_that_is_not_a_name_is_a_config_error():
    with pytest.raises(ConfigError, match="data.hf_revision='main; rm' is not a commit sha"):
        check_overrides(["data=tinystories", "data.hf_revision='main; rm'"])


def test_a_failed_load_leaves_no_lock_file(fake_hub, monkeypatch, tmp_path):
    cache = tmp_path / "cache"
    bad_column = DataConfig(name="hub", hf_path="some/corpus", text_field="body",
                            vocab_size=300, cache_dir=str(cache))
    with pytest.raises(DataError, match="no column 'body'"):
        prepare_data(bad_column)
    assert not list(cache.glob("*.lock"))

    def drop_midway(*args, **kwargs):
        yield {"text": "the first document"}
        raise ConnectionError("connection reset by peer")

    monkeypatch.setattr(datasets, "load_dataset", drop_midway)
    dropped = DataConfig(name="hub", hf_path="some/corpus", vocab_size=300, cache_dir=str(cache))
    with pytest.raises(DataError, match="ConnectionError: connection reset.*rerun `make data"):
        prepare_data(dropped)
    assert not list(cache.glob("*.lock")) and not list(cache.glob("*/manifest.json"))


def test_file_lock_removes_its_file_when_the_block_fails(tmp_path):
    lock = tmp_path / "entry.lock"
    with cache_module.file_lock(lock):
        assert lock.exists()
    assert lock.exists()  # a success keeps the (empty, unlocked) file
    with pytest.raises(RuntimeError), cache_module.file_lock(lock):
        raise RuntimeError("build failed")
    assert not lock.exists()
    with cache_module.file_lock(lock):  # and the lock can be taken again
        pass


def test_data_hub_streams_at_most_200000_documents_by_default(monkeypatch):
    cfg = check_overrides(["data=hub", "data.hf_path=some/corpus"]).data
    assert cfg.max_documents == 200_000
    assert check_overrides(["data=hub", "data.hf_path=some/corpus",
                            "data.max_documents=null"]).data.max_documents is None

    def endless(*args, **kwargs):  # a corpus larger than memory
        i = 0
        while True:
            i += 1
            yield {"text": f"document {i}"}

    monkeypatch.setattr(datasets, "load_dataset", endless)
    monkeypatch.setattr(corpus_module, "hub_unreachable_reason", lambda timeout_s=5.0: None)
    docs = load_hub_documents(cfg)
    assert len(docs) == 200_000 and docs[-1] == ("199999", "document 200000")


def test_make_data_runs_the_prepare_command():
    root = Path(__file__).resolve().parents[1]
    dry = subprocess.run(["make", "-n", "-o", "install", "data", "DATA=fineweb_edu",
                          "ARGS=data.max_documents=1000"], cwd=root, capture_output=True,
                         text=True, check=True)
    assert "-m critbatch.data prepare fineweb_edu data.max_documents=1000" in dry.stdout
    helped = subprocess.run(["make", "help"], cwd=root, capture_output=True, text=True, check=True)
    assert re.search(r"make data +token cache of DATA=", helped.stdout)
