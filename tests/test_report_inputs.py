"""A sweep rerun skips its analysis only while nothing the report was made from changed."""

from __future__ import annotations

import os

from critbatch.orchestration.report_inputs import fingerprint, record, up_to_date


def test_the_report_is_stale_after_any_input_changes(tmp_path):
    sweep, scripts = tmp_path / "runs" / "batch" / "smoke", tmp_path / "analysis"
    run = sweep / "optim=adamw,train.batch_size=4"
    (run / "branches" / "b1").mkdir(parents=True)
    scripts.mkdir()
    (scripts / "fit_bcrit.py").write_text("print('fit')\n")
    (run / "summary.json").write_text('{"val_loss": 5.0}')
    (run / "branches" / "b1" / "summary.json").write_text('{"val_loss": 5.5}')
    out = sweep / "report"
    out.mkdir()
    args = [str(sweep), "--out", str(out)]
    stamp = fingerprint([str(sweep)], args, scripts)

    assert not up_to_date(out, stamp)  # no report, no stamp
    (out / "report.md").write_text("# report\n")
    assert not up_to_date(out, stamp)
    record(out, stamp)
    assert up_to_date(out, stamp)

    # the report's own files are not inputs
    (out / "fits.json").write_text("{}")
    (out / "config.json").write_text("{}")
    assert fingerprint([str(sweep)], args, scripts) == stamp

    changes = [
        lambda: (run / "noise.json").write_text('{"b_noise": 1}'),  # B_noise measured
        lambda: os.utime(run / "branches" / "b1" / "summary.json", ns=(1, 1)),  # rewritten
        lambda: (scripts / "fit_bcrit.py").write_text("print('fit v2')\n"),  # new analysis
    ]
    for change in changes:
        change()
        fresh = fingerprint([str(sweep)], args, scripts)
        assert fresh != stamp and not up_to_date(out, fresh)
        stamp = fresh
    assert fingerprint([str(sweep)], [*args, "--baseline-batch", "8"], scripts) != stamp


def test_the_report_is_stale_after_the_analysis_code_changes(tmp_path, monkeypatch):
    """Every module the report is computed by counts, nested study packages included."""
    from critbatch.orchestration import report_inputs

    package, scripts = tmp_path / "critbatch", tmp_path / "analysis"
    scripts.mkdir()
    modules = [package / "analysis" / "bcrit" / "bcrit.py", package / "science" / "fits.py",
               package / "results" / "runs.py"]
    for module in modules:
        module.parent.mkdir(parents=True, exist_ok=True)
        module.write_text("x = 1\n")
    monkeypatch.setattr(report_inputs, "PACKAGE", package)
    stamp = fingerprint([], [], scripts)
    for module in modules:
        module.write_text("x = 2\n")
        assert fingerprint([], [], scripts) != stamp, f"{module} is not an input of the report"
        stamp = fingerprint([], [], scripts)
    (package / "training").mkdir()
    (package / "training" / "loop.py").write_text("x = 3\n")
    assert fingerprint([], [], scripts) == stamp  # training code does not make a report stale
