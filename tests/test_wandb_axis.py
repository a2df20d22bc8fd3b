"""W&B browses by tokens: an offline run defines `tokens` as the x axis of every curve and is
tagged so runs group by optimizer, width and batch size with no manual edit."""

from __future__ import annotations

import struct
import time
from pathlib import Path

from wandb.proto import wandb_internal_pb2 as pb

from critbatch.training.loop import train


def wandb_records(path: Path) -> list:
    """The records of an offline run's `.wandb` file (a header, then 32 KiB blocks of
    length-prefixed chunks: 4-byte checksum, 2-byte length, 1-byte type full/first/middle/last)
    written so far: a chunk cut short by the service still writing it ends the read (callers
    poll until the record they wait for is there)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, block, out, pending = 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if pos + 7 + length > len(data):  # a chunk the service is still writing: read later
            break
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4) and pending:  # a full record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def flushed_records(path: Path, kind: str, timeout_s: float = 20.0) -> list:
    """`wandb_records` once a record of `kind` is there: W&B's service process writes the
    file, and in one full test session (2026-12-02) this test read it before the service had
    flushed it (no metric record at all); run alone it passed 6 times in 6."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = wandb_records(path)
        if any(r.WhichOneof("record_type") == kind for r in records) or (
                time.monotonic() > deadline):
            return records
        time.sleep(0.2)


def test_an_offline_run_plots_against_tokens_and_is_tagged_by_batch(tiny_cfg, tmp_path):
    cfg = tiny_cfg("logger.mode=offline", "train.tokens=2048", "train.batch_size=8")
    train(cfg, tmp_path / "run")
    (path,) = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    records = flushed_records(path, "metric")
    metrics = [(r.metric.name, r.metric.glob_name, r.metric.step_metric)
               for r in records if r.WhichOneof("record_type") == "metric"]
    assert ("tokens", "", "") in metrics and ("", "*", "tokens") in metrics
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"][:1]
    assert {"adamw", "width32", "batch8"} <= set(run.tags)


def test_analysing_a_sweep_again_resumes_its_one_analysis_run(tmp_path):
    from critbatch.analysis.render import publish_report

    (tmp_path / "report.md").write_text("# report\n")
    ids = [publish_report(tmp_path, name="bcrit-batch-cpu", group="batch-cpu", mode="offline",
                          project="critbatch-test", config={}, images={},
                          files=["report.md"]) for _ in range(2)]
    assert ids[0] == ids[1] and ids[0].startswith("analysis-")
    # two sessions of one W&B run (wandb sync joins them); W&B adds "-1" to the folder of a
    # second session that starts within the same second
    sessions = [p.name.split("-", 3)[3] for p in tmp_path.glob("wandb/offline-run-*")]
    assert len(sessions) == 2 and all(s in (ids[0], f"{ids[0]}-1") for s in sessions)
    other = publish_report(tmp_path, name="bcrit-widths-cpu", group="widths-cpu",
                           mode="offline", project="critbatch-test", config={}, images={},
                           files=["report.md"])
    assert other != ids[0]
