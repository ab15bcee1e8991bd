"""instruments/hotspots.py: the source-page CSV parsed, opcodes and families read, the report's shares add up."""

import pytest

from instruments import hotspots, sass

PAGE = """==PROF== Connected to process 1
"Kernel Name","compute_out_kernel"
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)"
"00007f00","LDL R4, [R1+0x10]","300","290"
"00007f10","@P0 SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR4], R2","500","480"
"00007f20","HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24","100","20"
"00007f30","MUFU.EX2 R5, R5","80","40"
"00007f40","FMUL R6, R5, R7","20","5"
"""


def test_source_page_parsed_one_row_per_instruction():
    rows = hotspots.parse_source_csv(PAGE)
    assert [r["Address"] for r in rows] == ["00007f00", "00007f10", "00007f20", "00007f30", "00007f40"]
    assert rows[1][hotspots.SAMPLES] == 500.0 and rows[1][hotspots.NOT_ISSUED] == 480.0


@pytest.mark.parametrize("source, op", [("LDL R4, [R1+0x10]", "LDL"), ("@P0 SYNCS.PHASECHK.TRANS64 P1", "SYNCS"),
                                         ("@!UP1 HGMMA.64x64x16 R24", "HGMMA"), ("", "")],
                         ids=["plain", "predicated", "uniform-predicate", "empty"])
def test_opcode_read_past_the_predicate(source, op):
    assert sass.base_opcode(source) == op


def test_families_share_the_samples():
    fams = hotspots.by_family(hotspots.parse_source_csv(PAGE))
    names = [name for name, _, _ in fams]
    assert names[0] == "mbarrier (SYNCS: TMA arrivals)" and names[1] == "spill load (LDL)"
    assert sum(share for _, _, share in fams) == pytest.approx(100.0)
    assert hotspots.family("IMAD") == "IMAD"


def test_page_without_table_or_samples_refused():
    with pytest.raises(ValueError, match="no source table"):
        hotspots.parse_source_csv("==ERROR== nothing profiled\n")
    with pytest.raises(ValueError, match="Warp Stall Sampling"):
        hotspots.parse_source_csv('"Address","Source","Other"\n"0010","NOP","1"\n')


def test_report_lists_the_top_lines_first(tmp_path):
    rows = hotspots.parse_source_csv(PAGE)
    text = hotspots.report_text(rows, top=2)
    assert "5 SASS lines, 1000 samples" in text
    top = text.split("most samples")[1]
    assert top.index("SYNCS") < top.index("LDL") and "HGMMA" not in top
    hotspots.write_rows(rows, tmp_path / "h.csv", {"backend": "cutile"})
    assert (tmp_path / "h.csv").read_text().splitlines()[0].startswith("backend,Address,Source")
    import gzip

    hotspots.write_rows(rows, tmp_path / "h.csv.gz", {"backend": "cutile"})
    assert gzip.open(tmp_path / "h.csv.gz", "rt").read() == (tmp_path / "h.csv").read_text()


def test_bad_ablation_named(capsys):
    with pytest.raises(SystemExit):
        hotspots.main(["--kernel", "compute_out", "--ablation", "no_such_switch"])
    assert "--ablation" in capsys.readouterr().err


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_the_target_is_the_profilers_with_its_direction(monkeypatch, tmp_path, direction):
    """The sampled call is instruments/profile.py's target with every argument it takes (backend, shape, point,
    direction): a backward kernel is sampled inside a backward."""
    from instruments import profile

    monkeypatch.setattr(hotspots, "ncu", lambda: "ncu")
    cmd = hotspots.ncu_collect("triton", "S1", "none", "bwd_chunk", tmp_path / "r", direction)
    target = cmd[cmd.index("--target") + 1:]
    assert target == ["triton", "S1", "none", direction] and target[-1] in profile.DIRECTIONS
