"""The main job's summary in the simulator: the reference GPU's figures beside this run's checks; the
notebooks it finds."""

import io
import json

import pytest
from rich.console import Console

from workbook import report, results


def _chapter(mode, cases):
    return {"stamp": {"mode": mode}, "bars": [], "cases": [
        {"key": key, "size": size, "rows": [{"variant": v, "kind": "kernel", "correct": True, "median_ms": ms}
                                            for v, ms in rows]} for key, size, rows in cases]}


def test_a_simulator_run_shows_no_table_without_figures(tmp_path, monkeypatch):
    # the simulator ran a case at its own size (batch 3); the reference GPU ran batch 64 and a case
    # the simulator shares with it
    sim = _chapter("sim", [("forward, batch 3", "B=3", [("naive", None), ("fused", None)]),
                           ("shared case", "n=8", [("fused", None)])])
    gpu = _chapter("gpu", [("forward, batch 64", "B=64", [("naive", 9.0), ("fused", 1.5)]),
                           ("shared case", "n=2^28", [("fused", 0.5)])])
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "ch99.json").write_text(json.dumps(sim))
    monkeypatch.setattr(report, "_load", lambda chapter, slug, base=None:
                        sim if slug == "sim" else gpu if slug == results.REFERENCE_DEVICE else None)
    rows, _ = report.summary_rows(["ch99"], "sim", tmp_path)
    assert [(r["case"], r["kernel"], r["timed"], r["stored only"]) for r in rows] == [
        ("forward, batch 3 (B=3)", "naive", False, False), ("forward, batch 3 (B=3)", "fused", False, False),
        ("shared case (n=2^28)", "fused", True, False),
        ("forward, batch 64 (B=64)", "naive", True, True), ("forward, batch 64 (B=64)", "fused", True, True)]
    gpu["bars"] = [{"what": "fused vs naive [B=64]", "measured": 6.0, "spread": [5.9, 6.1], "target": ">= 5",
                    "met": True, "verdict": "met"}]
    sim["title"] = "A chapter"
    sim["cases"][0]["rows"][1]["correct"] = False
    out = io.StringIO()
    report.summary(Console(file=out, width=100), ["ch99"], "sim", tmp_path)
    text = " ".join(out.getvalue().split())  # lines wrap at the console's width
    # a few lines a chapter: what was checked here, then the bars as the reference GPU measured them
    assert "ch99 A chapter: 3 kernel runs checked in 2 cases, 1 wrong (forward, batch 3: fused)" in text
    assert "met fused vs naive [B=64]: 6 [5.9-6.1] (target >= 5)" in text
    assert "9 ms" not in text and "─" not in out.getvalue()  # no case tables: SUMMARY.md has them
    assert f"results/{results.REFERENCE_DEVICE}/SUMMARY.md" in text


def test_a_chapter_in_parts_is_a_notebook_a_part():
    """Chapter 09 is two notebooks, ch09a and ch09b, in one folder: asked for as ch09 (or by its
    folder), it runs both; each is its own notebook id, and its modules are not notebooks."""
    from workbook.report import chapter_of, chapter_scripts

    every = chapter_scripts()
    assert {"ch09a", "ch09b"} <= set(every) and "ch09" not in every
    assert [p.name for p in chapter_scripts(["ch09"]).values()] == ["ch09a_mma_sync.py", "ch09b_wgmma_conv.py"]
    assert list(chapter_scripts(["ch09_tensor_cores"])) == ["ch09a", "ch09b"]
    assert list(chapter_scripts(["ch09b"])) == ["ch09b"]
    assert list(chapter_scripts(["ch08"])) == ["ch08"] and chapter_of("ch09b") == "ch09"
    assert all(p.parent.name.startswith(chapter_of(i)) for i, p in every.items())
    with pytest.raises(SystemExit, match="no such chapter: ch09c"):
        chapter_scripts(["ch09c"])
