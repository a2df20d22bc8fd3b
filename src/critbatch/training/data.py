"""Corpora, the byte-level BPE tokenizer, the token-id cache, and batches.

Data flows: documents (local files or the hub) -> train/val split by a hash of
each document's id -> BPE trained on the train split -> uint16 token ids with
<|endoftext|> after every document -> memmaps under `data.cache_dir`, reused by
every run whose corpus and vocabulary match. Batches are random windows drawn
from a generator seeded by (seed, step), so a step's batch is a pure function of
the step and micro-batches are exact slices of it.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import socket
import sys
import sysconfig
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock
from omegaconf import OmegaConf

from critbatch.results.errors import DataError
from critbatch.results.files import write_bytes_atomic, write_json_atomic
from critbatch.training.config import CONF_DIR, DataConfig

CACHE_VERSION = 1
EOT = "<|endoftext|>"
HUB_CORPORA = ("tinystories", "fineweb_edu", "hub")
# the DataConfig fields that identify a hub corpus in the cache key
HUB_SPEC = ("hf_path", "hf_name", "hf_revision", "hf_split", "hf_data_files", "text_field",
            "max_documents")
PROGRESS_EVERY_S = 5.0  # off a terminal, long steps print a progress line this often


@dataclass
class Corpus:
    """Documents split into train and val, with a fingerprint of their content."""

    train: list[str]
    val: list[str]
    fingerprint: str  # sha256 over (document id, content) of every document
    skipped: int = 0  # stdlib files that are not valid UTF-8 (left out)


@dataclass
class TokenData:
    """Cached token ids (uint16 memmaps) and what describes them."""

    train: np.ndarray  # (n_train_tokens,) uint16
    val: np.ndarray  # (n_val_tokens,) uint16
    manifest: dict
    directory: Path

    @property
    def bytes_per_token(self) -> float:
        return float(self.manifest["bytes_per_token"])

    @property
    def fingerprint(self) -> str:
        return str(self.manifest["corpus_sha256"])

    def tokenizer(self):  # -> tokenizers.Tokenizer
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.directory / "tokenizer.json"))


# ---------------------------------------------------------------------------
# Progress of the slow steps (streaming, BPE training, encoding)


def say(message: str) -> None:
    """One progress line on stderr (beside tqdm's bars, away from the results on stdout)."""
    print(message, file=sys.stderr, flush=True)


class Progress:
    """A count of items done: a tqdm bar on a terminal, else a line every `PROGRESS_EVERY_S`.

    Logs and batch jobs get `<what>: 12,000/100,000 documents (1.3 MB/s, 10 s, ETA 73 s)` lines
    instead of a bar redrawn in place; `close()` prints the total and the time taken.
    """

    def __init__(self, what: str, total: int | None = None, unit: str = "documents") -> None:
        self.what, self.total, self.unit = what, total, unit
        self.count, self.bytes = 0, 0
        self.start = self.last = time.monotonic()
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=what, unit=f" {unit}")

    def update(self, n: int = 1, n_bytes: int = 0) -> None:
        self.count += n
        self.bytes += n_bytes
        if self.bar is not None:
            self.bar.update(n)
            return
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            elapsed = max(now - self.start, 1e-9)
            of = f"/{self.total:,}" if self.total else ""
            rate = f"{self.bytes / 1e6 / elapsed:.1f} MB/s, " if self.bytes else ""
            eta = (f", ETA {elapsed * (self.total - self.count) / self.count:.0f} s"
                   if self.total and 0 < self.count < self.total else "")
            say(f"{self.what}: {self.count:,}{of} {self.unit} ({rate}{elapsed:.0f} s{eta})")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        size = f" ({self.bytes / 1e6:.1f} MB)" if self.bytes else ""
        say(f"{self.what}: {self.count:,} {self.unit}{size} in "
            f"{time.monotonic() - self.start:.1f} s")


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


def _stdlib_files() -> list[tuple[str, Path]]:
    root = stdlib_dir()
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if "site-packages" in rel or "dist-packages" in rel:
            continue
        files.append((rel, path))
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
    import datasets

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


def load_local_documents(data: DataConfig) -> tuple[list[tuple[str, str]], int]:
    """(id, text) documents of a local corpus, and how many non-UTF-8 files were skipped."""
    if data.name == "stdlib":
        return _read_local(_stdlib_files(), strict_utf8=False)
    return _read_local(_text_files(list(data.paths)), strict_utf8=True)


# ---------------------------------------------------------------------------
# Tokenizer


def train_tokenizer(texts: list[str], vocab_size: int):  # -> tokenizers.Tokenizer
    """Byte-level BPE (GPT-2 style pre-tokenisation) with one special token, <|endoftext|>.

    Training reads every document (pre-tokenisation and word counts, most of the time) and
    then merges pairs. On a terminal `tokenizers` draws its own bars for both; elsewhere the
    reading is counted by `Progress` and the merges get a start and an end line.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    on_terminal = sys.stderr.isatty()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=on_terminal,
    )
    start = time.monotonic()
    say(f"training the BPE tokenizer ({vocab_size:,} tokens) on {len(texts):,} documents")
    feed = texts if on_terminal else _read_for_bpe(texts)
    tok.train_from_iterator(feed, trainer=trainer, length=len(texts))
    say(f"BPE tokenizer trained in {time.monotonic() - start:.1f} s")
    return tok


def _read_for_bpe(texts: list[str]) -> Iterator[str]:
    progress = Progress("BPE pre-tokenising", total=len(texts))
    for text in texts:
        yield text
        progress.update()
    progress.close()
    say("BPE merging pairs")


def encode_documents(tok, texts: list[str], what: str = "encoding") -> np.ndarray:
    """Token ids of the documents, each followed by <|endoftext|>, as one uint16 array."""
    eot = tok.token_to_id(EOT)
    parts = []
    batch = 256
    progress = Progress(what, total=len(texts))
    for i in range(0, len(texts), batch):
        for enc in tok.encode_batch(texts[i : i + batch]):
            parts.append(np.asarray(enc.ids, dtype=np.uint16))
            parts.append(np.asarray([eot], dtype=np.uint16))
        progress.update(len(texts[i : i + batch]))
    progress.close()
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)


# ---------------------------------------------------------------------------
# Cache


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (the `filelock` package: flock on Unix, msvcrt on Windows).

    The operating system drops the lock when its holder dies, so a lock left by a killed
    process never blocks a rerun. When the block fails, the lock file is removed while still
    held (a waiter that then locks the unlinked file sees it is gone and locks the new one),
    so a failed build leaves nothing behind; after a success the empty file stays.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(path):
        try:
            yield
        except BaseException:
            with contextlib.suppress(OSError):  # Windows: filelock removes it on release
                path.unlink()
            raise


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


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


def _manifest_ok(directory: Path, key: str) -> dict | None:
    """The manifest if the cache entry is complete and consistent, else None."""
    try:
        manifest = json.loads((directory / "manifest.json").read_text())
        if manifest.get("key") != key or manifest.get("version") != CACHE_VERSION:
            return None
        for split in ("train", "val"):
            size = (directory / f"{split}.bin").stat().st_size
            if size != 2 * int(manifest[f"{split}_tokens"]):
                return None
        if _sha256_file(directory / "tokenizer.json") != manifest["tokenizer_sha256"]:
            return None
        return manifest
    except (OSError, ValueError, KeyError):
        return None


def _build_cache(directory: Path, key: str, data: DataConfig, docs, skipped: int) -> dict:
    say(f"building the token cache of data={data.name} in {directory}")
    directory.mkdir(parents=True, exist_ok=True)
    train_texts, val_texts = split_documents(docs, data.val_fraction)
    tok = train_tokenizer(train_texts, data.vocab_size)
    tmp_tok = directory / f".tokenizer.{os.getpid()}.tmp"
    tok.save(str(tmp_tok))
    os.replace(tmp_tok, directory / "tokenizer.json")
    train_ids = encode_documents(tok, train_texts, "encoding the train split")
    val_ids = encode_documents(tok, val_texts, "encoding the val split")
    val_bytes = sum(len(t.encode()) for t in val_texts)
    write_bytes_atomic(directory / "train.bin", train_ids.tobytes())
    write_bytes_atomic(directory / "val.bin", val_ids.tobytes())
    manifest = {
        "version": CACHE_VERSION,
        "key": key,
        "data_name": data.name,
        "hf_revision": data.hf_revision if data.name in HUB_CORPORA else None,
        "corpus_sha256": corpus_fingerprint(docs),
        "documents": len(docs),
        "skipped_non_utf8": skipped,
        "vocab_size": data.vocab_size,
        "tokenizer_vocab_size": tok.get_vocab_size(),
        "tokenizer_sha256": _sha256_file(directory / "tokenizer.json"),
        "train_documents": len(train_texts),
        "val_documents": len(val_texts),
        "train_tokens": int(train_ids.size),
        "val_tokens": int(val_ids.size),
        "train_bytes": sum(len(t.encode()) for t in train_texts),
        "val_bytes": val_bytes,
        # bytes_per_token is measured on the validation split, EOT tokens included
        "bytes_per_token": val_bytes / max(1, int(val_ids.size)),
    }
    write_json_atomic(directory / "manifest.json", manifest)  # written last: marks complete
    return manifest


def prepare_data(data: DataConfig) -> TokenData:
    """Return the cached token ids for `data`, building the cache under a lock if needed.

    Several processes may call this at once: one builds, the others wait on the
    lock and then reuse the result. A truncated or mismatched entry is rebuilt. A hub
    corpus whose entry exists is read offline; one whose entry is missing needs the hub.
    """
    if data.name in HUB_CORPORA:
        docs, skipped, content_sha = None, 0, None
    else:
        docs, skipped = load_local_documents(data)
        if not docs:
            raise DataError(f"the {data.name} corpus is empty; point data at non-empty files")
        content_sha = corpus_fingerprint(docs)
    key, directory = cache_entry(data, content_sha)
    manifest = _manifest_ok(directory, key)
    if manifest is None:
        if docs is None and uses_hub(data):
            check_hub_reachable(data)  # before the lock: an offline run creates nothing
        try:
            with file_lock(directory.with_name(f"{directory.name}.lock")):
                manifest = _manifest_ok(directory, key)  # another process may have built it
                if manifest is None:
                    if docs is None:
                        docs = load_hub_documents(data)
                    manifest = _build_cache(directory, key, data, docs, skipped)
        except PermissionError as err:
            raise DataError(
                f"cannot write the token cache in {directory.parent} ({err.strerror}); "
                "set data.cache_dir to a writable folder"
            ) from None
    train = np.memmap(directory / "train.bin", dtype=np.uint16, mode="r")
    val = np.memmap(directory / "val.bin", dtype=np.uint16, mode="r")
    return TokenData(train=train, val=val, manifest=manifest, directory=directory)


def is_prepared(data: DataConfig) -> bool:
    """Whether `data`'s token cache exists and is complete (a hub corpus is not fetched)."""
    if data.name in HUB_CORPORA:
        content_sha = None
    else:
        docs, _ = load_local_documents(data)
        content_sha = corpus_fingerprint(docs) if docs else None
    key, directory = cache_entry(data, content_sha)
    return _manifest_ok(directory, key) is not None


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
    files = _stdlib_files() if data.name == "stdlib" else _text_files(list(data.paths))
    size = sum(path.stat().st_size for _, path in files)
    return size, size / PREPARE_BYTES_PER_S


def build_token_cache(data: DataConfig) -> TokenData:
    """`make data`: build (or find) the token cache of `data`, online once, and say where it is.

    Afterwards every run with the same data settings reads this cache and needs no network.
    """
    tokens = prepare_data(data)
    m = tokens.manifest
    revision = f" at revision {m['hf_revision']}" if m.get("hf_revision") else ""
    print(f"data={data.name}{revision}: {m['documents']:,} documents, {m['train_tokens']:,} "
          f"train and {m['val_tokens']:,} val tokens, {tokens.bytes_per_token:.2f} bytes/token, "
          f"cached in {tokens.directory}", flush=True)
    if data.name in HUB_CORPORA:
        print("runs with these data settings now train offline from it; for another machine, "
              f"copy that folder into its data.cache_dir ({data.cache_dir})", flush=True)
    return tokens


# ---------------------------------------------------------------------------
# Batches


def check_seq_len(tokens: TokenData, seq_len: int) -> None:
    for split, ids in (("train", tokens.train), ("val", tokens.val)):
        if ids.size < seq_len + 1:
            raise DataError(
                f"model.seq_len={seq_len} needs at least {seq_len + 1} {split} tokens but the "
                f"corpus has {ids.size}; lower model.seq_len or use a larger corpus"
            )


def coverage_warnings(tokens: TokenData, name: str, train_tokens: int, eval_tokens: int
                      ) -> list[str]:
    """One line each on a corpus too small for the run: the passes that `train_tokens` make over
    the train split (batches are random windows, so each token is seen that many times on
    average), and a val split shorter than `train.eval_tokens` (its windows then overlap: an
    evaluation reads every val token, some of them twice)."""
    lines = []
    if train_tokens > tokens.train.size:
        lines.append(
            f"warning: data={name} has {tokens.train.size:,} train tokens, fewer than the run's "
            f"{train_tokens:,}: it makes {train_tokens / tokens.train.size:.1f} passes over the "
            "data (text repeats; a larger corpus avoids it)")
    if eval_tokens > tokens.val.size:
        lines.append(
            f"warning: data={name} has {tokens.val.size:,} val tokens, fewer than "
            f"train.eval_tokens={eval_tokens:,}: each evaluation reads all of them in overlapping "
            "windows (lower train.eval_tokens, or give the corpus more text or a larger "
            "data.val_fraction)")
    return lines


def sample_batch(
    ids: np.ndarray, seq_len: int, batch_size: int, seed: int, step: int
) -> torch.Tensor:
    """Random windows of seq_len + 1 tokens for optimizer step `step`: (B, T + 1) int64.

    The generator is seeded from (seed, step), so the batch does not depend on
    who computes it or on what was drawn before (resume and accumulation safe).
    """
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, ids.size - seq_len, size=batch_size)  # last start: size - seq_len - 1
    window = starts[:, None] + np.arange(seq_len + 1)  # (B, T+1)
    return torch.from_numpy(ids[window].astype(np.int64))


def sample_chunks(ids: np.ndarray, seq_len: int, batch_size: int, seed: int,
                  sequences_done: int, chunk: int) -> torch.Tensor:
    """A step's batch as `batch_size / chunk` chunks of `chunk` windows: (B, T + 1) int64.

    Chunk i is `sample_batch(..., chunk, seed, c0 + i)` with c0 = sequences_done / chunk, so
    the sequences a run sees depend on how many it has trained, not on how they were split
    into steps: a run at batch k x chunk sees, over a window, exactly the sequences a run at
    batch chunk sees (`train.data_chunk`). With batch = chunk, c0 is the step, and the batch
    is `sample_batch`'s of that step.
    """
    assert batch_size % chunk == 0 and sequences_done % chunk == 0, (batch_size, chunk)
    first = sequences_done // chunk
    return torch.cat([sample_batch(ids, seq_len, chunk, seed, first + i)
                      for i in range(batch_size // chunk)])


def val_windows(ids: np.ndarray, seq_len: int, eval_tokens: int) -> torch.Tensor:
    """The fixed validation set: evenly spaced windows, (n_windows, seq_len + 1) int64."""
    n_windows = max(1, eval_tokens // seq_len)
    starts = np.linspace(0, ids.size - seq_len - 1, n_windows).astype(np.int64)
    window = starts[:, None] + np.arange(seq_len + 1)
    return torch.from_numpy(ids[window].astype(np.int64))
