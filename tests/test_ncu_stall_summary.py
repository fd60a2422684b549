"""benchmarks/ncu_stall_summary.py reads Nsight Compute's source-page CSV: the instructions with
the most stall samples first, each with its main reasons, and the totals per reason."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from ncu_stall_summary import read_rows, summarize  # noqa: E402

CSV = '''==PROF== a line ncu prints first
"# Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","stall_long_sb","stall_barrier","stall_long_sb_not_issued"
"0010","LDG.E R2, [R4.64]","10","8","1","0","1"
"0020","LDGSTS [R6], [R8.64]","60","50","54","6","50"
"0030","BAR.SYNC 0x0","30","30","0","30","0"
'''


def test_the_instruction_with_most_samples_comes_first_with_its_reasons(tmp_path):
    path = tmp_path / "source.csv"
    path.write_text(CSV)
    header, rows = read_rows(path)
    lines = summarize(header, rows, top=2)
    assert lines[0] == "3 SASS instructions, 100 stall samples"
    assert lines[1] == "by reason: stall_long_sb 55.0%, stall_barrier 36.0%"  # not-issued columns left out
    assert lines[2].startswith(" 60.0%") and "LDGSTS" in lines[2] and "stall_long_sb 90%" in lines[2]
    assert "BAR.SYNC" in lines[3] and "stall_barrier 100%" in lines[3]
    assert len(lines) == 4  # top=2


def test_a_csv_without_sample_columns_says_so(tmp_path):
    path = tmp_path / "source.csv"
    path.write_text('"# Address","Source"\n"0010","NOP"\n')
    try:
        read_rows(path)
    except SystemExit as stop:
        assert "no 'Warp Stall Sampling (All Samples)' column" in str(stop)
    else:
        raise AssertionError("expected a clear error")
