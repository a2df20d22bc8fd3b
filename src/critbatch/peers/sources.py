"""Where each public sweep's file comes from, and how to get a verified copy of it.

A source's file is read from a local folder (PEERS_DIR) or downloaded from a URL pinned to a
git commit into a cache folder; either way its sha256 must match the pinned one.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from critbatch.results.errors import ConfigError, ResultsError

_CHUNK = 1 << 20
RETRIES = 2  # a download that fails is tried this many more times


@dataclass(frozen=True)
class Source:
    """One public file: its local name, pinned download URL and sha256, and how to credit it."""

    key: str
    filename: str
    url: str
    sha256: str
    license: str
    citation: str
    commit: str
    path: str


def _github_raw(repo: str, commit: str, path: str) -> str:
    return f"https://raw.githubusercontent.com/{repo}/{commit}/{path}"


_STEPLAW_REPO = "step-law/steplaw"
_STEPLAW_COMMIT = "32a8f4cc50247695fb56cc6c9117abdf67c97763"
_STEPLAW_LICENSE = "none stated: read or downloaded, never copied into this repository"
_STEPLAW_DENSE = "data/dense_lr_bs_loss.csv"
_STEPLAW_BOOT = "data/1004_fitted_lr_bs_scaling_model_parameters.csv"

def _steplaw_file(key: str, filename: str, path: str, sha256: str, citation: str) -> Source:
    """One of Step Law's files at the pinned commit."""
    return Source(key=key, filename=filename, sha256=sha256, license=_STEPLAW_LICENSE,
                  url=_github_raw(_STEPLAW_REPO, _STEPLAW_COMMIT, path), citation=citation,
                  commit=_STEPLAW_COMMIT, path=path)


SOURCES: dict[str, Source] = {
    "steplaw": _steplaw_file(
        "steplaw", "steplaw_dense_lr_bs_loss.csv", _STEPLAW_DENSE,
        "9e46181076c04d450294d75dfe6f72adc416e231e154a07b337e378f9410002c",
        "Li et al. 2025, Predictable Scale: Part I (Step Law), dense grid"),
    "steplaw_bootstrap": _steplaw_file(
        "steplaw_bootstrap", "steplaw_fitted_lr_bs_bootstrap.csv", _STEPLAW_BOOT,
        "2252afbba5530e6ba6167e8101bd2b9082a018a58cb5922cc8672891a7f4336c",
        "Li et al. 2025, Step Law's 1,000 bootstrap fits of its lr and batch laws"),
}


def cache_dir() -> Path:
    """The download cache: `$CRITBATCH_CACHE/peers`, else `$XDG_CACHE_HOME/critbatch/peers`,
    else `~/.cache/critbatch/peers`."""
    if root := os.environ.get("CRITBATCH_CACHE"):
        return Path(root).expanduser() / "peers"
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg).expanduser() / "critbatch" / "peers"
    return Path.home() / ".cache" / "critbatch" / "peers"


def sha256_of(path: Path) -> str:
    """The hex sha256 of the file at `path`, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _from_folder(source: Source, peers_dir: str | Path) -> Path:
    path = Path(peers_dir).expanduser() / source.filename
    if not path.is_file():
        raise ResultsError(
            f"{path} does not exist: put {source.filename} there, or leave PEERS_DIR unset "
            f"to download it from {source.url}"
        )
    got = sha256_of(path)
    if got != source.sha256:
        raise ResultsError(
            f"{path}: sha256 {got} is not the expected {source.sha256}, so this is not the "
            f"pinned file: use the file at {source.url}"
        )
    return path


def _download(source: Source, cache: Path, timeout_s: float) -> Path:
    """`source`'s file downloaded into `cache` by pooch (retried twice, its sha256 checked
    before the file takes its name: a failed or corrupt download caches nothing)."""
    import pooch  # only a download needs it
    import requests

    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ResultsError(
            f"cannot write the cache folder {cache} ({_one_line(err)}): set CRITBATCH_CACHE to "
            f"a writable folder, or pass PEERS_DIR=<a folder holding {source.filename}>"
        ) from err
    fetcher = pooch.create(path=cache, base_url="", registry={
        source.filename: f"sha256:{source.sha256}"}, urls={source.filename: source.url},
        retry_if_failed=RETRIES)
    downloader = pooch.HTTPDownloader(progressbar=sys.stderr.isatty(), timeout=timeout_s)
    try:
        return Path(fetcher.fetch(source.filename, downloader=downloader))
    except ValueError as err:  # pooch: the hash is not the registry's, or a URL it cannot read
        if (got := re.search(r"but got (\w+)", str(err))) is None:
            raise ResultsError(f"cannot download {source.filename} from {source.url} "
                               f"({_one_line(err)[:200]})") from None
        raise ResultsError(
            f"{source.url}: sha256 {got[1]} is not the pinned "
            f"{source.sha256}; the source changed or the download is corrupt; nothing was cached"
        ) from None
    except (requests.RequestException, OSError) as err:
        raise ResultsError(
            f"cannot download {source.filename} from {source.url} ({_one_line(err)[:200]}): "
            f"offline? pass PEERS_DIR=<a folder holding {source.filename}> instead"
        ) from None


def locate(
    source: Source,
    peers_dir: str | Path | None = None,
    cache: Path | None = None,
    timeout_s: float = 60.0,
) -> Path:
    """The path of `source`'s file, its sha256 checked: `peers_dir/<filename>` when a folder is
    given, else the cached copy, downloaded from the pinned URL first when missing or wrong.

    Raises `ResultsError` (one line) when the file is missing, differs, or cannot be downloaded.
    """
    if peers_dir is not None:
        return _from_folder(source, peers_dir)
    cache = Path(cache) if cache is not None else cache_dir()
    cached = cache / source.filename
    if cached.is_file() and sha256_of(cached) == source.sha256:
        return cached
    return _download(source, cache, timeout_s)


def fetch_all(
    keys: Iterable[str],
    peers_dir: str | Path | None = None,
    cache: Path | None = None,
) -> dict[str, Path]:
    """`locate` each source in `keys` (names in `SOURCES`); returns key -> verified path."""
    paths: dict[str, Path] = {}
    for key in keys:
        if key not in SOURCES:
            raise ConfigError(f"unknown peer source {key!r}: choose from {', '.join(SOURCES)}")
        paths[key] = locate(SOURCES[key], peers_dir=peers_dir, cache=cache)
    return paths
