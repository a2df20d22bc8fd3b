"""Shared fixtures: a small real corpus, configs composed like the CLI does, a shared cache."""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import logging
import os
import shutil
from pathlib import Path

import pytest


def share_the_cores() -> None:
    """Under `make test`'s workers (pytest-xdist, one per core), each worker and every process
    it starts on its own share of the cores: torch's threads (and the sweeps' `job_threads`,
    which read the affinity) otherwise take every core in every worker, and on 2 cores the
    training tests ran 3.3x slower (110 s against 33 s for test_train.py and
    test_branches.py). Runs before anything imports torch."""
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if count < 2 or not worker.startswith("gw") or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    mine = cores[int(worker[2:]) % len(cores)::count] or cores
    os.sched_setaffinity(0, mine)
    os.environ["OMP_NUM_THREADS"] = str(len(mine))


share_the_cores()


def pytest_itemcollected(item) -> None:
    """A Monte Carlo study is slow too: `-m "not slow"` (`make test-fast`) leaves it out."""
    if item.get_closest_marker("study"):
        item.add_marker(pytest.mark.slow)


@pytest.hookimpl(trylast=True)  # on the tests left once `-m` has deselected
def pytest_collection_modifyitems(config, items) -> None:
    """Under `make test`'s workers, each starts with its share of the slow tests. xdist's
    worksteal scheduler first hands worker i the next len(left) // (workers - i) tests in
    this order, then moves queued tests from a busy worker to an idle one; so each first
    chunk opens with every n-th slow test (the minute-long sweeps start at once, one per
    core) and the fast ones fill the rest, where stealing can even out the end. In file
    order, the slow tests of a file (test_sweep.py's sweeps) all landed on one worker."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    slow = [item for item in items if item.get_closest_marker("slow")]
    fast = [item for item in items if not item.get_closest_marker("slow")]
    # a slow test's parametrizations stay together: the golden curves' three runs on one
    # worker, where the first builds the smoke token cache and the others read it (dealt to
    # both workers, one waited about 16 s on the other's build)
    groups: dict[str, list] = {}
    for item in slow:
        groups.setdefault(item.nodeid.split("[")[0], []).append(item)
    dealt = list(groups.values())
    ordered, left = [], len(items)
    for i in range(workers):
        chunk = left // (workers - i)
        mine = [item for group in dealt[i::workers] for item in group][:chunk]
        take = chunk - len(mine)
        ordered += mine + fast[:take]
        fast, left = fast[take:], left - chunk
    ordered += [item for item in slow if item not in ordered] + fast
    items[:] = ordered

# below: after the cores are shared (these import torch)
from critbatch.training.cli import check_overrides  # noqa: E402
from critbatch.training.config import Config  # noqa: E402
from critbatch.training.corpus import stdlib_dir  # noqa: E402

# The public sweeps' files, where a copy is at hand: $PEERS_DIR, else a `shared/data/peers`
# folder beside the repository. Tests of the real files skip without them (Step Law's have no
# license: they are never copied into the repository).
PEERS_DIR = Path(os.environ.get("PEERS_DIR")
                 or Path(__file__).resolve().parents[2] / "shared" / "data" / "peers")
SAMPLE_PACKAGES = ("json", "email", "logging")  # real Python text, about 0.5 MB


@pytest.fixture(scope="session", autouse=True)
def one_blas_thread():
    """numpy/scipy's BLAS on one thread in every test process, as the analysis commands run
    it (`render.one_blas_thread`): the tests' matrices are small and `make test` runs one
    worker per core, where a threaded BLAS only contends."""
    from critbatch.analysis.render import one_blas_thread

    with one_blas_thread():
        yield


@pytest.fixture(autouse=True)
def restore_logging():
    """Each test starts and ends with the loggers it found: a Hydra run in-process configures
    the root and critbatch loggers with handlers on pytest's captured streams, which are
    closed after that test and made later tests print '--- Logging error ---'."""
    loggers = [logging.getLogger(), logging.getLogger("critbatch")]
    saved = [(lg.handlers[:], lg.level, lg.propagate, lg.disabled) for lg in loggers]
    yield
    for lg, (handlers, level, propagate, disabled) in zip(loggers, saved, strict=True):
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate, lg.disabled = propagate, disabled


@pytest.fixture(autouse=True)
def collectable_after():
    """A test that spread refits over processes (`parallel.process_map` freezes the objects
    alive before it forks, for a command that then exits) leaves the session's objects to the
    collector again, as the next test expects."""
    yield
    if gc.get_freeze_count():
        gc.unfreeze()


@pytest.fixture
def dynamo_warnings():
    """The messages torch._dynamo logs during the test (a fallback to eager mode says so)."""
    from critbatch.bench.gpu_check import FallbackWatch

    recorder, logger = FallbackWatch(), logging.getLogger("torch._dynamo")
    logger.addHandler(recorder)
    yield recorder.messages
    logger.removeHandler(recorder)


@pytest.fixture
def train_cli(monkeypatch, capsys):
    """critbatch-train's main() run in this process: args -> (exit status, stderr)."""
    import sys

    from critbatch.training import cli

    def run(args: list[str]) -> tuple[int, str]:
        monkeypatch.setattr(sys, "argv", ["critbatch.train", *args])
        try:
            cli.main()
            code = 0
        except SystemExit as exc:
            code = exc.code
        return code, capsys.readouterr().err.strip()

    return run


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    """A small corpus of real UTF-8 text files (copied from the stdlib); under `make test`'s
    workers one folder for all of them (written whole, then renamed into place), so its
    token cache in `cache_dir` is built once."""
    root = tmp_path_factory.mktemp("corpus")
    for package in SAMPLE_PACKAGES:
        for path in sorted((stdlib_dir() / package).glob("*.py")):
            shutil.copy(path, root / f"{package}_{path.stem}.txt")
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return root
    shared = tmp_path_factory.getbasetemp().parent / "corpus"
    with contextlib.suppress(OSError):  # another worker's is in place: the same files
        root.rename(shared)
    return shared


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """One token cache for the whole session (building it is the slow part), shared by
    `make test`'s workers: each cache is built under its file lock (`token_cache`), so the
    first worker to need one builds it and the others read it."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "cache"
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def tiny_overrides(corpus_dir, cache_dir) -> list[str]:
    """Command-line overrides for a tiny model trained on the small corpus."""
    return [
        "scale=smoke",
        "data=text_files",
        f"data.paths=[{corpus_dir}/*.txt]",
        f"data.cache_dir={cache_dir}",
        "data.vocab_size=512",
        "model.width=32",
        "model.heads=2",
        "model.depth=2",
        "model.seq_len=32",
        "logger.mode=disabled",
        "train.eval_tokens=2048",
    ]


@pytest.fixture
def tiny_cfg(tiny_overrides):
    """Build a Config from overrides on a tiny model trained on the small corpus."""

    def make(*overrides: str) -> Config:
        return check_overrides(tiny_overrides + list(overrides))

    return make


@pytest.fixture
def analysis_main():
    """Loads `main` of a user script in analysis/ from its file (in-process: fast)."""
    def load(script: str):
        path = Path(__file__).resolve().parents[1] / "analysis" / script
        spec = importlib.util.spec_from_file_location(f"analysis_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.main
    return load


_TRAINED: dict = {}


@pytest.fixture
def accum_run(tiny_cfg, tmp_path_factory):
    """160 steps of 16 sequences as 4 micro-batches of 4 (online GNS on); trained once per
    test process: (run folder, summary, config)."""
    from critbatch.training.loop import train

    if "run" not in _TRAINED:
        run_dir = tmp_path_factory.mktemp("accum_run")
        cfg = tiny_cfg("train.batch_size=16", "train.micro_batch_size=4", "train.tokens=81920")
        _TRAINED["run"] = (run_dir, train(cfg, run_dir), cfg)
    return _TRAINED["run"]


@pytest.fixture
def http_folder():
    """Serve a folder over HTTP on 127.0.0.1 (a real server in a thread, as the downloads
    meet one): `http_folder(folder)` returns the base URL, ending in '/'."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:  # no request lines in the test output
            pass

    servers = []

    def serve(folder: Path) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0),
                                     functools.partial(Quiet, directory=str(folder)))
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()
