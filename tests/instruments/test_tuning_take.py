"""instruments/tuning_take.py: the records of GPU runs merged into the tree entry by entry, in any order."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from instruments import tuning_take

GPU = "NVIDIA_H200"
STACK = {"triton": "3.6.0", "driver": "580"}


def measured(n):
    return [{"config": {"block_rows": 16 * (i + 1)}, "us": 10.0 + i} for i in range(n)]


def entry(date, block=64, versions=None, searched=8):
    """A record entry whose search measured `searched` configs (those a partial of up to that many holds)."""
    return {"config": {"block_rows": block}, "date": date, "versions": {**(versions or STACK), "torch": "2.11.0"},
            "measurements": measured(searched), "failures": []}


def record(**entries):
    return {"backend": "triton", "stage": "compute_out", "gpu": GPU, "entries": entries}


def partial(n, versions=None):
    return {"space_hash": "abc", "versions": versions or STACK, "measurements": measured(n), "failures": []}


def archive(path, files, prefix="./"):
    """A tuning.tar.gz as scripts/gpu_session.sh writes it (`tar -C tuning .`), or with another prefix."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            raw = json.dumps(data).encode()
            info = tarfile.TarInfo(f"{prefix}{GPU}/{name}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return path


def read(root, name):
    return json.loads((root / GPU / name).read_text())


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tuning"
    (root / GPU).mkdir(parents=True)
    (root / GPU / "triton_compute_out.json").write_text(json.dumps(record(S1=entry("2026-12-01T00:00:00"))))
    return root


@pytest.mark.parametrize("order", [(0, 1), (1, 0)], ids=["first-run-first", "second-run-first"])
def test_two_runs_from_one_tree_keep_both_searches(tree, tmp_path, order):
    base = entry("2026-12-01T00:00:00")
    runs = [archive(tmp_path / "a.tgz", {"triton_compute_out.json": record(S1=base, S2=entry("2026-12-05T10:00:00"))}),
            archive(tmp_path / "b.tgz", {"triton_compute_out.json": record(S1=base, S3=entry("2026-12-05T11:00:00"))})]
    tuning_take.take([runs[i] for i in order], tree)
    assert sorted(read(tree, "triton_compute_out.json")["entries"]) == ["S1", "S2", "S3"]


@pytest.mark.parametrize("order", [(0, 1), (1, 0)], ids=["older-first", "newer-first"])
def test_the_later_search_of_a_key_wins_whatever_the_order(tree, tmp_path, order):
    runs = [archive(tmp_path / "a.tgz", {"triton_compute_out.json": record(S1=entry("2026-12-05T10:00:00", 32))}),
            archive(tmp_path / "b.tgz", {"triton_compute_out.json": record(S1=entry("2026-12-05T11:00:00", 128))})]
    tuning_take.take([runs[i] for i in order], tree)
    assert read(tree, "triton_compute_out.json")["entries"]["S1"]["config"] == {"block_rows": 128}


def test_an_older_record_does_not_replace_the_tree_s(tree, tmp_path):
    """Kept, and said: the archive's differing record is not dropped in silence."""
    old = archive(tmp_path / "a.tgz", {"triton_compute_out.json": record(S1=entry("2026-11-30T00:00:00", 32))})
    assert tuning_take.take([old], tree) == [
        "NVIDIA_H200/triton_compute_out.json: kept the tree's S1 (searched 2026-12-01T00:00:00); the archive's "
        "differs and is not later (2026-11-30T00:00:00)"]
    assert read(tree, "triton_compute_out.json")["entries"]["S1"]["config"] == {"block_rows": 64}
    same = archive(tmp_path / "b.tgz", {"triton_compute_out.json": record(S1=entry("2026-12-01T00:00:00"))})
    assert tuning_take.take([same], tree) == []  # the same record: nothing to say


def test_an_unreadable_member_is_named(tree, tmp_path):
    bad = tmp_path / "bad.tgz"
    with tarfile.open(bad, "w:gz") as tar:
        raw = b'{"entries": {'
        info = tarfile.TarInfo(f"./{GPU}/triton_compute_out.json")
        info.size = len(raw)
        tar.addfile(info, io.BytesIO(raw))
    with pytest.raises(ValueError, match=r"member './NVIDIA_H200/triton_compute_out.json' is not readable JSON"):
        tuning_take.take([bad], tree)


def test_a_finished_search_drops_its_partial_and_an_unfinished_one_keeps_the_fuller(tree, tmp_path):
    (tree / GPU / "triton_compute_out.partial.json").write_text(json.dumps({"S2": partial(3), "S4": partial(2)}))
    run = archive(tmp_path / "a.tgz", {
        "triton_compute_out.json": record(S2=entry("2026-12-05T10:00:00")),  # S2's search finished in this run
        "triton_compute_out.partial.json": {"S2": partial(5), "S4": partial(7)},  # S4's went further, unfinished
    })
    changes = tuning_take.take([run], tree)
    left = read(tree, "triton_compute_out.partial.json")
    assert sorted(left) == ["S4"] and len(left["S4"]["measurements"]) == 7
    assert any("dropped" in c and "S2" in c for c in changes)


def test_a_record_that_does_not_cover_the_partial_leaves_it(tree, tmp_path):
    """The tree's record of S1 is an older search (2 configs); a later search of S1 on the same stack was cut after
    5: its partial stays, and the change says so."""
    run = archive(tmp_path / "a.tgz", {
        "triton_compute_out.json": record(S1=entry("2026-12-01T00:00:00", searched=2)),
        "triton_compute_out.partial.json": {"S1": partial(5)},
    })
    (tree / GPU / "triton_compute_out.json").write_text(json.dumps(record(S1=entry("2026-12-01T00:00:00",
                                                                                    searched=2))))
    changes = tuning_take.take([run], tree)
    assert len(read(tree, "triton_compute_out.partial.json")["S1"]["measurements"]) == 5
    assert any("unfinished search of S1" in c for c in changes)


def test_a_partial_of_another_stack_stays(tree, tmp_path):
    (tree / GPU / "triton_compute_out.partial.json").write_text(json.dumps({"S1": partial(3)}))
    other = {"triton": "3.5.0", "driver": "580"}
    run = archive(tmp_path / "a.tgz", {"triton_compute_out.json": record(S1=entry("2026-12-05T10:00:00",
                                                                                    versions=other))})
    tuning_take.take([run], tree)
    assert sorted(read(tree, "triton_compute_out.partial.json")) == ["S1"]


@pytest.mark.parametrize("dry_run", [False, True], ids=["written", "dry-run"])
def test_a_partial_file_left_empty_is_deleted(tree, tmp_path, dry_run):
    (tree / GPU / "triton_compute_out.partial.json").write_text(json.dumps({"S1": partial(3)}))
    run = archive(tmp_path / "a.tgz", {"triton_compute_out.json": record(S1=entry("2026-12-05T10:00:00"))})
    changes = tuning_take.take([run], tree, dry_run=dry_run)
    assert any("deleted" in c for c in changes)
    assert (tree / GPU / "triton_compute_out.partial.json").exists() == dry_run


def test_an_interrupted_first_search_writes_no_empty_record(tree, tmp_path):
    """A partial file whose stage has no record yet stays as it is, and no record file appears for it."""
    run = archive(tmp_path / "a.tgz", {"triton_chunk_state.partial.json": {"S1": partial(4)}})
    tuning_take.take([run], tree)
    assert not (tree / GPU / "triton_chunk_state.json").exists()
    assert len(read(tree, "triton_chunk_state.partial.json")["S1"]["measurements"]) == 4


@pytest.mark.parametrize("prefix", ["./", "tuning/", ""], ids=["gpu-session", "tuning-folder", "bare"])
def test_archive_layouts(tree, tmp_path, prefix):
    run = archive(tmp_path / "a.tgz", {"triton_chunk_state.json": record(S9=entry("2026-12-05T10:00:00"))}, prefix)
    tuning_take.take([run], tree)
    assert list(read(tree, "triton_chunk_state.json")["entries"]) == ["S9"]


@pytest.mark.parametrize("name", ["../NVIDIA_H200/x.json", "/x.json", "/NVIDIA_H200/x.json"],
                         ids=["parent", "absolute-two-parts", "absolute"])
def test_a_member_outside_gpu_folders_is_refused(tree, tmp_path, name):
    bad = tmp_path / "a.tgz"
    with tarfile.open(bad, "w:gz") as tar:
        info = tarfile.TarInfo(name)
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    with tarfile.open(bad) as tar:
        assert tar.getnames() == [name]  # stored as given
    with pytest.raises(ValueError, match="not <gpu>/<file>.json"):
        tuning_take.take([bad], tree)


def test_dry_run_writes_nothing(tree, tmp_path):
    before = (tree / GPU / "triton_compute_out.json").read_text()
    run = archive(tmp_path / "a.tgz", {"triton_compute_out.json": record(S2=entry("2026-12-05T10:00:00"))})
    assert tuning_take.take([run], tree, dry_run=True)
    assert (tree / GPU / "triton_compute_out.json").read_text() == before


def test_a_missing_archive_names_the_argument(tree, capsys):
    with pytest.raises(SystemExit):
        tuning_take.main([str(tree / "nope.tgz"), "--tuning", str(tree)])
    assert "archives" in capsys.readouterr().err
