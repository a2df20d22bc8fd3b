"""Corpus loading, tokenizer, token cache (reuse, rebuild, concurrency), hub path, batches."""

from __future__ import annotations

import json
import multiprocessing as mp
import sys
from pathlib import Path

import numpy as np
import pytest

from critbatch.results.errors import DataError
from critbatch.training import corpus as corpus_module
from critbatch.training import data as data_module
from critbatch.training import token_cache as cache_module
from critbatch.training.config import DataConfig
from critbatch.training.corpus import (
    is_val_document,
    load_hub_documents,
    load_local_documents,
    split_documents,
    stdlib_dir,
)
from critbatch.training.data import sample_batch, val_windows
from critbatch.training.token_cache import encode_documents, prepare_data, train_tokenizer


def text_cfg(corpus: Path, cache: Path, **kw) -> DataConfig:
    return DataConfig(name="text_files", paths=[f"{corpus}/*.txt"], cache_dir=str(cache),
                      vocab_size=kw.pop("vocab_size", 512), **kw)


def test_tokenizer_round_trip_and_eot(corpus_dir):
    docs, _ = load_local_documents(DataConfig(name="text_files", paths=[f"{corpus_dir}/*.txt"]))
    tok = train_tokenizer([t for _, t in docs], vocab_size=400)
    assert tok.get_vocab_size() == 400
    samples = [
        "def f(x):\n    return x ** 2  # square\n",
        "  leading spaces, tabs\t and\r\nCRLF",
        "unicode: caf\u00e9 \u65e5\u672c \U0001f600 \u00df",
        "",
    ]
    for text in samples:
        assert tok.decode(tok.encode(text).ids) == text
    ids = encode_documents(tok, ["a b", "c"])
    eot = tok.token_to_id(cache_module.EOT)
    assert ids.dtype == np.uint16
    assert list(ids).count(eot) == 2 and ids[-1] == eot
    texts = [t for _, t in docs] + samples  # the fast encoder gives encode_batch's very ids
    want = [i for enc in tok.encode_batch(texts) for i in [*enc.ids, eot]]
    assert encode_documents(tok, texts).tolist() == want


def test_cache_manifest_and_bytes_per_token(corpus_dir, tmp_path):
    tokens = prepare_data(text_cfg(corpus_dir, tmp_path))
    m = tokens.manifest
    assert m["train_tokens"] == tokens.train.size > 50_000
    assert m["val_tokens"] == tokens.val.size > 0
    # bytes_per_token is the validation split's UTF-8 bytes over its tokens
    docs, _ = load_local_documents(text_cfg(corpus_dir, tmp_path))
    _, val = split_documents(docs, 0.02)
    val_bytes = sum(len(t.encode()) for t in val)
    assert m["val_bytes"] == val_bytes
    assert tokens.bytes_per_token == pytest.approx(val_bytes / tokens.val.size)
    assert 1.5 < tokens.bytes_per_token < 6
    assert len(tokens.fingerprint) == 64
    tok = tokens.tokenizer()
    eot = tok.token_to_id(cache_module.EOT)
    assert int(np.max(tokens.train)) < 512 and (tokens.val == eot).sum() == m["val_documents"]


def test_cache_is_reused(corpus_dir, tmp_path, monkeypatch):
    first = prepare_data(text_cfg(corpus_dir, tmp_path))

    def refuse(*args, **kwargs):
        raise AssertionError("cache was rebuilt although it is valid")

    monkeypatch.setattr(cache_module, "_build_cache", refuse)
    second = prepare_data(text_cfg(corpus_dir, tmp_path))
    assert second.manifest == first.manifest


def test_truncated_cache_is_rebuilt(corpus_dir, tmp_path):
    first = prepare_data(text_cfg(corpus_dir, tmp_path))
    original = np.array(first.train)
    path = first.directory / "train.bin"
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 2)
    second = prepare_data(text_cfg(corpus_dir, tmp_path))
    assert np.array_equal(np.array(second.train), original)


def test_mismatched_manifest_is_rebuilt(corpus_dir, tmp_path):
    first = prepare_data(text_cfg(corpus_dir, tmp_path))
    manifest_path = first.directory / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["key"] = "something-else"
    manifest_path.write_text(json.dumps(manifest))
    second = prepare_data(text_cfg(corpus_dir, tmp_path))
    assert second.manifest["key"] == first.manifest["key"]


def test_changed_corpus_gets_a_new_cache_entry(corpus_dir, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for path in sorted(corpus_dir.glob("*.txt"))[:10]:
        (corpus / path.name).write_text(path.read_text())
    first = prepare_data(text_cfg(corpus, tmp_path / "cache", vocab_size=300))
    (corpus / "extra.txt").write_text("one more document\n" * 20)
    second = prepare_data(text_cfg(corpus, tmp_path / "cache", vocab_size=300))
    assert second.fingerprint != first.fingerprint
    assert second.directory != first.directory


def _build_in_child(args) -> dict:
    corpus, cache = args
    return prepare_data(text_cfg(Path(corpus), Path(cache))).manifest


@pytest.mark.slow
def test_two_processes_building_at_once_end_with_one_valid_cache(corpus_dir, tmp_path):
    cache = tmp_path / "cache"
    with mp.get_context("spawn").Pool(2) as pool:
        manifests = pool.map(_build_in_child, [(str(corpus_dir), str(cache))] * 2)
    assert manifests[0] == manifests[1]
    entries = [p for p in cache.iterdir() if p.is_dir()]
    assert len(entries) == 1
    assert not list(entries[0].glob(".*tmp"))  # no temporary file left behind
    assert cache_module._manifest_ok(entries[0], manifests[0]["key"]) is not None


def test_stdlib_listing_excludes_site_packages_and_holds_out_two_percent():
    files = corpus_module._stdlib_files()
    rels = [rel for rel, _ in files]
    assert rels == sorted(rels)
    assert not any("site-packages" in rel for rel in rels)
    assert "json/decoder.py" in rels
    share = sum(is_val_document(rel, 0.02) for rel in rels) / len(rels)
    assert 0.01 < share < 0.035


def _rglob_listing(root: Path) -> tuple:
    """The stdlib listing by its definition: every *.py under `root` as pathlib's rglob
    finds them (into no linked folder), in path order, those of installed packages left out."""
    return tuple((p.relative_to(root).as_posix(), p) for p in sorted(root.rglob("*.py"))
                 if not any(s in p.relative_to(root).as_posix()
                            for s in ("site-packages", "dist-packages")))


def test_the_stdlib_listing_is_rglob_s_without_walking_installed_packages(tmp_path):
    """The walk that skips installed packages' folders lists what rglob lists, in its order
    (path parts, not strings: a/b.py before a-b/c.py), on a planted tree and on this
    Python's stdlib. The fault guarded: a listing in another order or with other files
    changes the corpus fingerprint, and so the token cache every run reads."""
    for rel in ("a/b.py", "a-b/c.py", "x.py", "y.txt", "lib/site-packages/pkg/m.py",
                "lib/dist-packages/n.py", "lib/ok/site-packages-ish/o.py", "deep/e/f/g.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("pass\n")
    (tmp_path / "linked").symlink_to(tmp_path / "deep")  # a linked folder: not walked
    listing = corpus_module._stdlib_listing.__wrapped__
    assert listing(tmp_path) == _rglob_listing(tmp_path)
    assert [rel for rel, _ in listing(tmp_path)] == ["a/b.py", "a-b/c.py", "deep/e/f/g.py",
                                                     "x.py"]
    root = stdlib_dir()
    assert listing(root) == _rglob_listing(root)


def test_missing_empty_and_non_utf8_corpora_are_data_errors(tmp_path):
    with pytest.raises(DataError, match="matched no files"):
        prepare_data(DataConfig(name="text_files", paths=[str(tmp_path / "nope/*.txt")],
                                cache_dir=str(tmp_path / "c")))
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "a.txt").write_text("")
    with pytest.raises(DataError, match="empty"):
        prepare_data(DataConfig(name="text_files", paths=[f"{empty}/*.txt"],
                                cache_dir=str(tmp_path / "c")))
    latin = tmp_path / "latin"
    latin.mkdir()
    (latin / "a.txt").write_bytes("caf\u00e9".encode("latin-1"))
    with pytest.raises(DataError, match="not UTF-8"):
        prepare_data(DataConfig(name="text_files", paths=[f"{latin}/*.txt"],
                                cache_dir=str(tmp_path / "c")))
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").glob("*/manifest.json"))


def test_hub_code_path_on_a_local_parquet_dataset(tmp_path, corpus_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [p.read_text() for p in sorted(corpus_dir.glob("*.txt"))]
    files = []
    for i in range(2):
        path = tmp_path / f"part{i}.parquet"
        pq.write_table(pa.table({"text": texts[i::2], "id": list(range(len(texts[i::2])))}), path)
        files.append(str(path))
    cfg = DataConfig(name="hub", hf_path="parquet", hf_data_files=files, max_documents=20,
                     cache_dir=str(tmp_path / "cache"), vocab_size=400)
    docs = load_hub_documents(cfg)
    assert len(docs) == 20
    tokens = prepare_data(cfg)
    assert tokens.manifest["documents"] == 20
    assert tokens.train.size > 1000 and tokens.val.size > 0
    bad = DataConfig(name="hub", hf_path="parquet", hf_data_files=files, text_field="body")
    with pytest.raises(DataError, match="no column 'body'"):
        load_hub_documents(bad)


def test_the_hub_path_without_its_extra_names_it(monkeypatch):
    """`datasets` is the hub extra's (pip install 'critbatch[hub]'): without it, data=hub
    stops in one line that names the extra."""
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(DataError, match=r"pip install 'critbatch\[hub\]'"):
        load_hub_documents(DataConfig(name="hub", hf_path="parquet", hf_data_files=["x"]))


def test_unreachable_hub_fails_fast_with_a_hint(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    cfg = DataConfig(name="fineweb_edu", hf_path="HuggingFaceFW/fineweb-edu")
    with pytest.raises(DataError, match=r"run `make data DATA=fineweb_edu ARGS=\"data.vocab"):
        load_hub_documents(cfg)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # streams are not served from the datasets cache
    with pytest.raises(DataError, match=r"hub cannot be reached \(HF_HUB_OFFLINE is set\)"):
        load_hub_documents(cfg)


def test_batches_are_a_pure_function_of_seed_and_step():
    ids = np.arange(10_000, dtype=np.uint16)
    a = sample_batch(ids, 16, 8, seed=3, step=5)
    assert a.shape == (8, 17)
    assert (a[:, 1:] - a[:, :-1] == 1).all()  # contiguous windows
    assert (sample_batch(ids, 16, 8, seed=3, step=5) == a).all()
    assert not (sample_batch(ids, 16, 8, seed=3, step=6) == a).all()
    assert not (sample_batch(ids, 16, 8, seed=4, step=5) == a).all()
    assert int(a.max()) < 10_000


def test_validation_windows_are_fixed_and_cover_the_split():
    ids = np.arange(5_000, dtype=np.uint16)
    w = val_windows(ids, 64, 640)
    assert w.shape == (10, 65)
    assert int(w[0, 0]) == 0 and int(w[-1, -1]) == 4_999
    assert (val_windows(ids, 64, 640) == w).all()


def test_seq_len_larger_than_the_data_allows(corpus_dir, tmp_path):
    tokens = prepare_data(text_cfg(corpus_dir, tmp_path))
    with pytest.raises(DataError, match="model.seq_len"):
        data_module.check_seq_len(tokens, tokens.val.size + 10)


def test_the_sweep_builds_the_token_cache_first_and_says_so(tiny_cfg, tmp_path, capsys):
    from critbatch.orchestration.workers import prepare_data_first
    from critbatch.training.token_cache import is_prepared

    cfg = tiny_cfg(f"data.cache_dir={tmp_path / 'fresh'}")
    assert not is_prepared(cfg.data)
    prepare_data_first([cfg, cfg])  # one corpus, built once
    out = capsys.readouterr().out
    assert out.count("building its token cache first") == 1 and "data ready in" in out
    assert is_prepared(cfg.data)
    prepare_data_first([cfg])  # already there: nothing to say
    assert capsys.readouterr().out == ""


def test_the_corpus_fingerprint_is_read_once_and_again_when_a_file_changes(tmp_path,
                                                                           monkeypatch):
    """Every run and branch of a sweep worker asks for its corpus's fingerprint: the files are
    read and hashed once per process, and again after any of them changes (a stale
    fingerprint would train on a token cache of the old text)."""
    for name in ("a", "b"):
        (tmp_path / f"{name}.txt").write_text(f"the text of {name}\n" * 50)
    cfg = text_cfg(tmp_path, tmp_path / "cache")
    reads = []
    real = corpus_module._read_local
    monkeypatch.setattr(corpus_module, "_read_local",
                        lambda files, strict_utf8: reads.append(1) or real(files, strict_utf8))
    first = corpus_module.local_fingerprint(cfg)
    docs, _ = real(corpus_module.local_files(cfg), True)
    assert first == corpus_module.corpus_fingerprint(docs)
    assert corpus_module.local_fingerprint(cfg) == first and len(reads) == 1
    with open(tmp_path / "b.txt", "a") as handle:
        handle.write("one more line\n")
    changed = corpus_module.local_fingerprint(cfg)
    assert changed != first and len(reads) == 2
    (tmp_path / "c.txt").write_text("a new file\n")
    assert corpus_module.local_fingerprint(cfg) not in (first, changed)
