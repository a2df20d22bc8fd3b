"""Corpora: where a run's documents come from (the Python stdlib, local text files, or a
`datasets` corpus streamed from the hub or a local builder), their train/val split by a hash
of each document's id, and their fingerprint; the token cache entry a corpus maps to (its key
and folder, the `make data` command that builds it, the time to build it from the corpus's
size) and the fail-fast check for a hub corpus that has none while the hub is unreachable. The
cache itself is training/token_cache.py.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import socket
import sysconfig
import urllib.parse
from dataclasses import asdict, dataclass
from pathlib import Path

from omegaconf import OmegaConf

from critbatch.results.errors import DataError
from critbatch.training.config import CONF_DIR, DataConfig
from critbatch.training.progress import Progress

CACHE_VERSION = 1
HUB_CORPORA = ("tinystories", "fineweb_edu", "hub")
# the DataConfig fields that identify a hub corpus in the cache key
HUB_SPEC = ("hf_path", "hf_name", "hf_revision", "hf_split", "hf_data_files", "text_field",
            "max_documents")


@dataclass
class Corpus:
    """Documents split into train and val, with a fingerprint of their content."""

    train: list[str]
    val: list[str]
    fingerprint: str  # sha256 over (document id, content) of every document
    skipped: int = 0  # stdlib files that are not valid UTF-8 (left out)


# ---------------------------------------------------------------------------
# Documents


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def is_val_document(doc_id: str, val_fraction: float) -> bool:
    """A fixed, reproducible share of documents, chosen by a hash of their id."""
    h = int.from_bytes(hashlib.sha256(doc_id.encode()).digest()[:8], "big")
    return h / 2**64 < val_fraction


def _read_local(files: list[tuple[str, Path]], strict_utf8: bool) -> tuple[list, int]:
    docs, skipped = [], 0
    for doc_id, path in files:
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            if strict_utf8:
                raise DataError(
                    f"corpus file {path} is not UTF-8 (byte {err.start}); convert it "
                    "(e.g. iconv -t UTF-8) or drop it from data.paths"
                ) from None
            skipped += 1
            continue
        if text:
            docs.append((doc_id, text))
    return docs, skipped


THIRD_PARTY = ("site-packages", "dist-packages")  # installed packages: not the stdlib


@functools.cache
def _stdlib_listing(root: Path) -> tuple[tuple[str, Path], ...]:
    """The stdlib's *.py files under `root`, in path order, listed once per process (the
    stdlib does not change while a process runs). The walk skips the installed packages'
    folders rather than listing them: a venv's site-packages held ~50,000 paths, which took
    0.7 s to list where the stdlib alone takes a few hundredths."""
    paths = []
    for folder, dirs, names in os.walk(root):  # as rglob: into no linked folder
        dirs[:] = [d for d in dirs if not any(part in d for part in THIRD_PARTY)]
        paths += [Path(folder, name) for name in names if name.endswith(".py")]
    files = []
    for path in sorted(paths):
        rel = path.relative_to(root).as_posix()
        if not any(part in rel for part in THIRD_PARTY):
            files.append((rel, path))
    return tuple(files)


def _stdlib_files() -> list[tuple[str, Path]]:
    root = stdlib_dir()
    files = list(_stdlib_listing(root))
    if not files:
        raise DataError(f"no *.py files under the stdlib directory {root}; use data=text_files")
    return files


def _text_files(patterns: list[str]) -> list[tuple[str, Path]]:
    paths: set[Path] = set()
    for pattern in patterns:
        matched = glob.glob(os.path.expanduser(pattern), recursive=True)
        paths.update(Path(p).resolve() for p in matched if Path(p).is_file())
    if not paths:
        raise DataError(
            f"data.paths={list(patterns)} matched no files; check the glob patterns "
            "(quote them: data.paths='[corpus/**/*.txt]')"
        )
    ordered = sorted(paths)
    root = Path(os.path.commonpath([str(p.parent) for p in ordered]))
    return [(p.relative_to(root).as_posix(), p) for p in ordered]


LOCAL_BUILDERS = ("parquet", "json", "csv", "text", "arrow")


def uses_hub(data: DataConfig) -> bool:
    """Whether loading `data` needs the Hugging Face hub (not a local builder or folder)."""
    if data.name not in HUB_CORPORA:
        return False
    if not data.hf_path:
        raise DataError(f"data={data.name} needs data.hf_path (a datasets id or 'parquet')")
    return data.hf_path not in LOCAL_BUILDERS and not os.path.exists(data.hf_path)


def hub_unreachable_reason(timeout_s: float = 5.0) -> str | None:
    """Why the Hugging Face hub cannot be reached now, or None when it can.

    A socket probe answers in at most `timeout_s`; without it, `datasets` retries for
    about 30 seconds and prints a warning per try.
    """
    if os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE"):
        return "HF_HUB_OFFLINE is set"
    from huggingface_hub import constants

    url = urllib.parse.urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout_s).close()
    except OSError as err:
        return f"{constants.ENDPOINT} is unreachable: {err}"
    return None


def _override(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return "'[" + ",".join(str(v) for v in value) + "]'"
    return str(value)


def prepare_command(data: DataConfig) -> str:
    """The `make data` command that builds the very token cache entry `data` asks for.

    It states the vocabulary (scale presets change it) and every field of the cache key,
    plus data.cache_dir, that differs from the preset conf/data/<name>.yaml.
    """
    preset = asdict(DataConfig())
    path = CONF_DIR / "data" / f"{data.name}.yaml"
    if path.exists():
        preset.update(OmegaConf.to_container(OmegaConf.load(path)))
    args = [f"data.vocab_size={data.vocab_size}"]
    for key in (*HUB_SPEC, "val_fraction", "cache_dir"):
        if getattr(data, key) != preset[key]:
            args.append(f"data.{key}={_override(getattr(data, key))}")
    return f'make data DATA={data.name} ARGS="{" ".join(args)}"'


def check_hub_reachable(data: DataConfig) -> None:
    """Fail fast, in one line, when `data` has no token cache and the hub cannot be reached.

    Streamed datasets are not read back from the `datasets` cache, so HF_HUB_OFFLINE=1 does
    not help: what works offline is critbatch's own token cache, built once with network by
    `make data DATA=<name>` (or copied from a machine that built it).
    """
    reason = hub_unreachable_reason()
    if reason is None:
        return
    _, directory = cache_entry(data, None)
    raise DataError(
        f"data={data.name} has no token cache in {directory} and the Hugging Face hub cannot be "
        f"reached ({reason}); run `{prepare_command(data)}` once on a machine with network (or "
        f"copy the folder {directory.name} from one that has it into {directory.parent}), after "
        "which training runs offline from critbatch's token cache"
    )


def load_hub_documents(data: DataConfig) -> list[tuple[str, str]]:
    """Stream the first `data.max_documents` documents of a `datasets` corpus at `data.hf_revision`.

    Works for hub ids (`HuggingFaceFW/fineweb-edu`) and for local builders such as
    `hf_path=parquet` with `hf_data_files`, which is how it is tested offline.
    """
    try:
        import datasets
    except ImportError:
        raise DataError(f"data={data.name} streams through the `datasets` package, which is not "
                        "installed: pip install 'critbatch[hub]' (make install brings it)"
                        ) from None
    if uses_hub(data):
        check_hub_reachable(data)
    docs: list[tuple[str, str]] = []
    progress = Progress(f"streaming {data.hf_path}", total=data.max_documents)
    try:
        stream = datasets.load_dataset(
            data.hf_path,
            data.hf_name,
            split=data.hf_split,
            streaming=True,
            data_files=list(data.hf_data_files) or None,
            revision=data.hf_revision,
        )
        for i, row in enumerate(stream):
            if data.max_documents is not None and len(docs) >= data.max_documents:
                break
            if data.text_field not in row:
                raise DataError(
                    f"{data.hf_path} has no column '{data.text_field}' (columns: "
                    f"{', '.join(row)}); set data.text_field"
                )
            text = row[data.text_field]
            if text:
                docs.append((f"{i}", text))
                progress.update(n_bytes=len(text.encode()))
    except DataError:
        raise
    except Exception as err:  # network, missing dataset or revision, bad files: one message
        reason = " ".join(str(err).split())[:200]
        fix = (f"; if the network dropped, rerun `{prepare_command(data)}`" if uses_hub(data)
               else "")
        raise DataError(
            f"could not load '{data.hf_path}' through datasets ({type(err).__name__}: {reason}); "
            f"check data.hf_path, data.hf_name, data.hf_split and data.hf_revision{fix}"
        ) from None
    progress.close()
    if not docs:
        raise DataError(f"'{data.hf_path}' gave no documents; check data.hf_split and filters")
    return docs


def split_documents(docs: list[tuple[str, str]], val_fraction: float) -> tuple[list, list]:
    """Split (id, text) documents into train and val texts by a hash of the id."""
    if not docs:
        raise DataError("the corpus is empty (no non-empty documents); point data at real text")
    train = [text for doc_id, text in docs if not is_val_document(doc_id, val_fraction)]
    val = [text for doc_id, text in docs if is_val_document(doc_id, val_fraction)]
    if not val or not train:  # tiny corpora: hold out the tail of the text instead
        text = "\n".join(t for _, t in docs)
        cut = int(len(text) * (1 - val_fraction))
        train, val = [text[:cut]], [text[cut:]]
    return train, val


def corpus_fingerprint(docs: list[tuple[str, str]]) -> str:
    h = hashlib.sha256()
    for doc_id, text in docs:
        h.update(doc_id.encode())
        h.update(b"\0")
        h.update(hashlib.sha256(text.encode()).digest())
    return h.hexdigest()


def local_files(data: DataConfig) -> list[tuple[str, Path]]:
    """(id, path) of a local corpus's files, in order."""
    return _stdlib_files() if data.name == "stdlib" else _text_files(list(data.paths))


def load_local_documents(data: DataConfig) -> tuple[list[tuple[str, str]], int]:
    """(id, text) documents of a local corpus, and how many non-UTF-8 files were skipped."""
    return _read_local(local_files(data), strict_utf8=data.name != "stdlib")


# corpus_fingerprint by the files' (id, size, mtime): every run and branch of a sweep worker
# asks for the fingerprint of the same corpus (the stdlib: 31 MB read and hashed, 0.3 s)
_FINGERPRINTS: dict[tuple, str | None] = {}


def local_fingerprint(data: DataConfig) -> str | None:
    """`corpus_fingerprint` of a local corpus's documents (None when it has none), read and
    hashed again only when a file's size or modification time changed in this process."""
    files = local_files(data)
    signature = (data.name != "stdlib",) + tuple(
        (rel, stat.st_size, stat.st_mtime_ns) for rel, path in files for stat in [path.stat()])
    if signature not in _FINGERPRINTS:
        docs, _ = load_local_documents(data)
        _FINGERPRINTS[signature] = corpus_fingerprint(docs) if docs else None
    return _FINGERPRINTS[signature]


# ---------------------------------------------------------------------------
# The token cache entry of a corpus


def _hub_spec(data: DataConfig) -> dict:
    spec = {key: getattr(data, key) for key in HUB_SPEC}
    spec["hf_data_files"] = list(data.hf_data_files)
    if spec["hf_revision"] is None:  # left out when unset: older entries keep their keys
        del spec["hf_revision"]
    return spec


def cache_key(data: DataConfig, content_sha: str | None) -> str:
    """Identity of a cache entry: corpus content (local) or its spec (hub, revision included),
    vocab, split."""
    source = content_sha if content_sha is not None else json.dumps(_hub_spec(data), sort_keys=True)
    ident = json.dumps([CACHE_VERSION, data.name, source, data.vocab_size, data.val_fraction])
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def cache_entry(data: DataConfig, content_sha: str | None) -> tuple[str, Path]:
    """The cache key of `data` and the folder of its entry under `data.cache_dir`."""
    key = cache_key(data, content_sha)
    root = Path(os.path.expanduser(data.cache_dir))
    return key, root / f"{data.name}-v{data.vocab_size}-{key}"


# Building a token cache (BPE training, then encoding) at 2,048 tokens on 2 cores: the stdlib
# corpus, 31.5 MB of text, in 10 s at load 0.8 and 54 s at load 5 (2026-12-01); the plan
# states the quiet machine's rate, as its training estimate does
PREPARE_BYTES_PER_S = 3.0e6


def prepare_estimate(data: DataConfig) -> tuple[int | None, float | None]:
    """(bytes of text, estimated seconds) to build `data`'s token cache, from the sizes of a
    local corpus's files (nothing is read); (None, None) for a hub corpus, whose download
    time is unknown."""
    if data.name in HUB_CORPORA:
        return None, None
    files = local_files(data)
    size = sum(path.stat().st_size for _, path in files)
    return size, size / PREPARE_BYTES_PER_S
