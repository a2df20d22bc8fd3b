"""critbatch.peers.sources: pinned files from a local folder or a checked, cached download."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest
from conftest import PEERS_DIR

from critbatch.peers import sources
from critbatch.peers.sources import SOURCES, Source, cache_dir, fetch_all, locate, sha256_of
from critbatch.results.errors import ResultsError

SHARED_PEERS = PEERS_DIR

CSV = b"lr,bs,loss\n0.001,64,3.5\n0.002,128,3.4\n"


@pytest.fixture
def origin(tmp_path: Path, http_folder) -> tuple[Path, Source]:
    """A small file served over HTTP, and a source pinned to it."""
    return _origin(tmp_path, http_folder)


def _origin(tmp_path: Path, http_folder, data: bytes = CSV) -> tuple[Path, Source]:
    origin = tmp_path / "origin" / "grid.csv"
    origin.parent.mkdir()
    origin.write_bytes(data)
    source = dataclasses.replace(
        SOURCES["steplaw"],
        url=http_folder(origin.parent) + origin.name,
        sha256=hashlib.sha256(data).hexdigest(),
        filename="grid.csv",
    )
    return origin, source


def _one_line_error(excinfo: pytest.ExceptionInfo[ResultsError]) -> str:
    message = str(excinfo.value)
    assert "\n" not in message and message
    return message


def test_sha256_of_matches_hashlib(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(CSV * 1000)
    assert sha256_of(path) == hashlib.sha256(CSV * 1000).hexdigest()


def test_download_caches_then_serves_offline(tmp_path: Path, origin) -> None:
    origin, source = origin
    cache = tmp_path / "cache" / "deep"
    got = locate(source, cache=cache)
    assert got == cache / "grid.csv"
    assert got.read_bytes() == CSV
    assert sorted(p.name for p in cache.iterdir()) == ["grid.csv"]
    origin.unlink()
    assert locate(source, cache=cache) == got
    assert got.read_bytes() == CSV


def test_wrong_cached_copy_is_downloaded_again(tmp_path: Path, origin) -> None:
    _, source = origin
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "grid.csv").write_bytes(b"stale\n")
    assert locate(source, cache=cache).read_bytes() == CSV


def test_sha256_mismatch_caches_nothing(tmp_path: Path, origin, monkeypatch) -> None:
    monkeypatch.setattr(sources, "RETRIES", 0)
    _, source = origin
    source = dataclasses.replace(source, sha256="0" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(ResultsError) as excinfo:
        locate(source, cache=cache)
    message = _one_line_error(excinfo)
    assert "sha256" in message and "nothing was cached" in message
    assert list(cache.iterdir()) == []


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/x.csv", "missing"])
def test_offline_points_to_peers_dir(tmp_path: Path, url: str, http_folder, monkeypatch) -> None:
    monkeypatch.setattr(sources, "RETRIES", 0)  # each retry waits a second or more
    if url == "missing":  # a server that answers 404
        (tmp_path / "served").mkdir()
        url = http_folder(tmp_path / "served") + "x.csv"
    source = dataclasses.replace(SOURCES["steplaw"], url=url)
    cache = tmp_path / "cache"
    with pytest.raises(ResultsError) as excinfo:
        locate(source, cache=cache, timeout_s=5.0)
    message = _one_line_error(excinfo)
    assert "PEERS_DIR" in message and source.filename in message
    assert list(cache.iterdir()) == []


def test_peers_dir_file_present(tmp_path: Path, origin) -> None:
    origin, source = origin
    assert locate(source, peers_dir=origin.parent) == origin
    assert locate(source, peers_dir=str(origin.parent)) == origin


def test_peers_dir_file_missing(tmp_path: Path, origin) -> None:
    _, source = origin
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ResultsError) as excinfo:
        locate(source, peers_dir=empty)
    message = _one_line_error(excinfo)
    assert str(empty / "grid.csv") in message and "PEERS_DIR" in message


def test_peers_dir_wrong_content(tmp_path: Path, origin) -> None:
    origin, source = origin
    origin.write_bytes(b"something else\n")
    with pytest.raises(ResultsError) as excinfo:
        locate(source, peers_dir=origin.parent)
    message = _one_line_error(excinfo)
    assert "sha256" in message and source.sha256 in message and source.url in message


def test_fetch_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin) -> None:
    origin, source = origin
    monkeypatch.setitem(SOURCES, "toy", dataclasses.replace(source, key="toy"))
    assert fetch_all(["toy"], peers_dir=origin.parent) == {"toy": origin}
    assert fetch_all(["toy"], cache=tmp_path / "c") == {"toy": tmp_path / "c" / "grid.csv"}


def test_sources_are_pinned() -> None:
    for key, source in SOURCES.items():
        assert source.key == key
        assert source.commit in source.url and source.url.endswith(source.path)
        assert len(source.sha256) == 64 and len(source.commit) == 40


def test_cache_dir_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRITBATCH_CACHE", str(tmp_path / "cb"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "cb" / "peers"
    monkeypatch.delenv("CRITBATCH_CACHE")
    assert cache_dir() == tmp_path / "xdg" / "critbatch" / "peers"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "critbatch" / "peers"


def test_real_steplaw_files(tmp_path: Path, http_folder) -> None:
    if not (SHARED_PEERS / SOURCES["steplaw"].filename).is_file():
        pytest.skip(f"no Step Law files under {SHARED_PEERS}")
    for key in ("steplaw", "steplaw_bootstrap"):
        real = SHARED_PEERS / SOURCES[key].filename
        assert sha256_of(real) == SOURCES[key].sha256
    assert fetch_all(["steplaw", "steplaw_bootstrap"], peers_dir=SHARED_PEERS) == {
        key: SHARED_PEERS / SOURCES[key].filename for key in ("steplaw", "steplaw_bootstrap")
    }
    real = SHARED_PEERS / SOURCES["steplaw"].filename
    source = dataclasses.replace(SOURCES["steplaw"], url=http_folder(SHARED_PEERS) + real.name)
    got = locate(source, cache=tmp_path / "cache")
    assert got == tmp_path / "cache" / source.filename
    assert sha256_of(got) == source.sha256
