"""The golden-hash fixtures (cuTile's normalised SASS, Triton's normalised PTX, under tests/fixtures/): what a fresh
set of hashes changes against the recorded one, naming the fixture and the command that re-records it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Fixture:
    """A JSON record {"toolchain": {...}, "hashes": {variant id: hash}} and the module that writes it."""

    path: Path
    module: str  # `python -m <module> --write <path> [args]` re-records it (args: which entries)
    facts: str  # the command that shows a variant's facts

    @property
    def name(self) -> str:
        """The fixture's path in the repository."""
        return self.path.relative_to(REPO).as_posix() if self.path.is_relative_to(REPO) else str(self.path)

    def command(self, args: tuple[str, ...] = ()) -> str:
        return " ".join(("python -m", self.module, "--write", self.name, *args))

    def stale(self, record: dict, toolchain: dict, got: dict[str, str], args: tuple[str, ...] = ()) -> str | None:
        """Why `got` (the hashes of some variants, computed under `toolchain`) does not match `record` (the fixture's
        toolchain and its hashes of the same variants), naming the fixture and how to re-record it (`args`: the
        command's selection of those variants); None when all match."""
        if toolchain != record["toolchain"]:
            return (f"{self.name} was recorded under {record['toolchain']}, this toolchain is {toolchain}: install "
                    f"the pinned versions (scripts/install.sh), or, where the pins moved, re-record the whole "
                    f"fixture: `{self.command()}`")
        recorded = record["hashes"]
        changed = sorted(k for k in set(got) | set(recorded) if got.get(k) != recorded.get(k))
        if not changed:
            return None
        return (f"{changed}: the normalised code differs from {self.name} (new, gone or changed; `{self.facts}` shows "
                f"the variants' facts). Where the change is meant, re-record it: `{self.command(args)}`")


def merged(old: dict | None, toolchain: dict, hashes: dict[str, str], keep: Callable[[str], bool]) -> dict:
    """The record after re-recording `hashes`: `old`'s entries for which keep(id) holds (in their order, those
    re-recorded replaced), then the new ones. Refused (ValueError) where old entries are kept but were recorded
    under another toolchain: hashes of two toolchains never share a fixture."""
    old = old or {}
    entries = {k: v for k, v in old.get("hashes", {}).items() if keep(k) or k in hashes}
    if set(entries) - set(hashes) and old.get("toolchain") != toolchain:
        raise ValueError(f"the fixture was recorded under {old.get('toolchain')}, this toolchain is {toolchain}: "
                         "re-record all of it (no selection)")
    return {**old, "toolchain": toolchain, "hashes": {**entries, **hashes}}
