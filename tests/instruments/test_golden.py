"""instruments/golden.py: a golden-hash fixture that no longer matches fails naming the fixture and the command that
re-records it (never a skip); re-recording some entries keeps the others. No compile: hashes are given."""

from __future__ import annotations

import pytest

from instruments import golden
from instruments.triton import ptx_hashes

pytestmark = pytest.mark.quick

FIXTURE = golden.Fixture(golden.REPO / "tests" / "fixtures" / "k_before.json", "impls.k.hashes", "python -m impls.k")
RECORD = {"toolchain": {"cc": "1.0"}, "hashes": {"a-bf16": "1", "b-bf16": "2"}}


def test_matching_hashes_pass():
    assert FIXTURE.stale(RECORD, {"cc": "1.0"}, {"a-bf16": "1", "b-bf16": "2"}) is None


@pytest.mark.parametrize("got, named", [
    pytest.param({"a-bf16": "1", "b-bf16": "9"}, "['b-bf16']", id="changed"),
    pytest.param({"a-bf16": "1"}, "['b-bf16']", id="gone"),
    pytest.param({"a-bf16": "1", "b-bf16": "2", "c-bf16": "3"}, "['c-bf16']", id="new"),
])
def test_a_changed_variant_fails_naming_the_fixture_and_the_command(got, named):
    message = FIXTURE.stale(RECORD, {"cc": "1.0"}, got, ("--dtype", "bf16"))
    assert message.startswith(named)
    assert "`python -m impls.k.hashes --write tests/fixtures/k_before.json --dtype bf16`" in message


def test_another_toolchain_fails_naming_the_whole_rerecord():
    message = FIXTURE.stale(RECORD, {"cc": "2.0"}, {"a-bf16": "1", "b-bf16": "2"}, ("a-bf16",))
    assert "tests/fixtures/k_before.json was recorded under {'cc': '1.0'}" in message
    assert message.endswith("`python -m impls.k.hashes --write tests/fixtures/k_before.json`")


def test_the_real_fixtures_are_named_by_their_repository_path():
    assert ptx_hashes.FIXTURE.path.is_file()
    assert ptx_hashes.FIXTURE.command(("--dtype", "fp32")) == (
        "python -m instruments.triton.ptx_hashes --write tests/fixtures/triton_ptx_before.json --dtype fp32")


def test_rerecording_some_entries_keeps_the_others_in_order():
    new = golden.merged(RECORD, {"cc": "1.0"}, {"a-bf16": "7", "c-bf16": "3"}, keep=lambda k: True)
    assert list(new["hashes"].items()) == [("a-bf16", "7"), ("b-bf16", "2"), ("c-bf16", "3")]
    dropped = golden.merged(RECORD, {"cc": "1.0"}, {"a-bf16": "7"}, keep=lambda k: k != "b-bf16")
    assert dropped["hashes"] == {"a-bf16": "7"}


def test_kept_entries_of_another_toolchain_are_refused():
    with pytest.raises(ValueError, match="re-record all of it"):
        golden.merged(RECORD, {"cc": "2.0"}, {"a-bf16": "7"}, keep=lambda k: True)
    whole = golden.merged(RECORD, {"cc": "2.0"}, {"a-bf16": "7"}, keep=lambda k: False)
    assert whole == {"toolchain": {"cc": "2.0"}, "hashes": {"a-bf16": "7"}}
