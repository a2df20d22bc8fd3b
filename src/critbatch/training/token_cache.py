"""The token-id cache: a byte-level BPE trained on a corpus's train split, every document's
token ids (uint16, <|endoftext|> after each) written as memmaps under `data.cache_dir`, and
reused by every run whose corpus and vocabulary match. Built once under a file lock; a
truncated or mismatched entry is rebuilt. Documents and the cache key: training/corpus.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from filelock import FileLock

from critbatch.results.errors import DataError
from critbatch.results.files import atomic_path, write_bytes_atomic, write_json_atomic
from critbatch.training.config import DataConfig
from critbatch.training.corpus import (
    CACHE_VERSION,
    HUB_CORPORA,
    cache_entry,
    check_hub_reachable,
    corpus_fingerprint,
    load_hub_documents,
    load_local_documents,
    local_fingerprint,
    split_documents,
    uses_hub,
)
from critbatch.training.progress import Progress, say

EOT = "<|endoftext|>"


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
    """Token ids of the documents, each followed by <|endoftext|>, as one uint16 array
    (`encode_batch_fast`: the ids of `encode_batch` without the character offsets)."""
    eot = tok.token_to_id(EOT)
    parts = []
    batch = 256
    progress = Progress(what, total=len(texts))
    for i in range(0, len(texts), batch):
        for enc in tok.encode_batch_fast(texts[i : i + batch]):  # ids only: no offsets
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
    with atomic_path(directory / "tokenizer.json") as tmp:
        tok.save(str(tmp))
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
    content_sha = None if data.name in HUB_CORPORA else local_fingerprint(data)
    if data.name not in HUB_CORPORA and content_sha is None:
        raise DataError(f"the {data.name} corpus is empty; point data at non-empty files")
    key, directory = cache_entry(data, content_sha)
    manifest = _manifest_ok(directory, key)
    if manifest is None:
        if content_sha is None and uses_hub(data):
            check_hub_reachable(data)  # before the lock: an offline run creates nothing
        try:
            with file_lock(directory.with_name(f"{directory.name}.lock")):
                manifest = _manifest_ok(directory, key)  # another process may have built it
                if manifest is None:
                    docs, skipped = (load_hub_documents(data), 0) if content_sha is None \
                        else load_local_documents(data)
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
    content_sha = None if data.name in HUB_CORPORA else local_fingerprint(data)
    key, directory = cache_entry(data, content_sha)
    return _manifest_ok(directory, key) is not None


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
