"""Takes the tuning records that GPU runs returned (`tuning.tar.gz`, one per `scripts/gpu_session.sh` phase) into the
tree's `tuning/` folder, whatever order the archives come in.

Each archive holds the whole tuning folder as that run saw it at its end: the records it started from (the tree it
was given) plus what its searches stored. Unpacking archives over the tree loses records when two runs started from
the same tree (the second archive lacks the first one's searches) and keeps partial files of searches that have
finished since (a finished search deletes its partial file on the GPU machine; unpacking deletes nothing). So the
records are merged entry by entry instead:
- a record entry (`<gpu>/<backend>_<stage>.json`, one per key) new to the tree is added; one the tree has already is
  replaced only by a later `date` (the search that ran last wins, as it would have on one machine);
- a partial entry (`<backend>_<stage>.partial.json`, an interrupted search's measurements) is dropped once the merged
  record holds its key, searched on the same software stack (each version the partial names) and with every config
  the partial measured among the record's measurements or failures: that search has finished. A record that does
  not cover it (another space, or a later search of the same key cut off in its turn) leaves the partial in place.
  Of two partial entries for one key the one with more measurements is kept (on equal counts, the tree's). A
  partial file left empty is deleted.

    python -m instruments.tuning_take ARCHIVE [ARCHIVE ...] [--tuning tuning] [--dry-run]

Prints one line per change; `--dry-run` prints them and writes nothing.
"""

from __future__ import annotations

import argparse
import json
import tarfile
from pathlib import Path, PurePosixPath

from impls import tuning

PARTIAL = ".partial.json"


def read_archive(path: str | Path) -> dict[str, dict]:
    """{'<gpu>/<file>.json': content} of a tuning archive; members may sit under a leading 'tuning/' or './'."""
    out = {}
    with tarfile.open(path, "r:*") as tar:
        for member in tar.getmembers():
            if not member.isfile() or not member.name.endswith(".json"):
                continue
            parts = [p for p in PurePosixPath(member.name).parts if p not in (".", "")]
            if parts and parts[0] == "tuning":
                parts = parts[1:]
            if PurePosixPath(member.name).is_absolute() or len(parts) != 2 or ".." in parts:
                raise ValueError(f"archive {path}: member {member.name!r} is not <gpu>/<file>.json")
            try:
                out["/".join(parts)] = json.load(tar.extractfile(member))
            except ValueError as exc:
                raise ValueError(f"archive {path}: member {member.name!r} is not readable JSON ({exc})") from exc
    return out


def merge_records(ours: dict, theirs: dict, name: str) -> tuple[dict, list[str]]:
    """`ours` (a record file, or {}) with `theirs`' entries taken in: new keys added, existing ones replaced only by
    a later date."""
    merged = dict(ours) if ours else {k: v for k, v in theirs.items() if k != "entries"}
    entries = dict(merged.get("entries", {}))
    changes = []
    for key, entry in theirs.get("entries", {}).items():
        have = entries.get(key)
        if have is None:
            changes.append(f"{name}: added {key}")
        elif str(entry.get("date", "")) > str(have.get("date", "")):
            changes.append(f"{name}: replaced {key} (searched {entry.get('date')})")
        else:
            if entry != have:  # said, not dropped in silence: the tree's record is the later (or as late)
                changes.append(f"{name}: kept the tree's {key} (searched {have.get('date')}); the archive's differs "
                               f"and is not later ({entry.get('date')})")
            continue
        entries[key] = entry
    merged["entries"] = entries
    return merged, changes


def merge_partials(ours: dict, theirs: dict, records: dict, name: str) -> tuple[dict, list[str]]:
    """The partial entries of both, the fuller of two for one key, less those whose search has finished (`_finished`
    by the merged `records`)."""
    merged, changes = dict(ours), []
    for key, entry in theirs.items():
        have = merged.get(key)
        if have is None or len(entry.get("measurements", [])) > len(have.get("measurements", [])):
            if entry != have:
                changes.append(f"{name}: {'added' if have is None else 'replaced'} the unfinished search of {key} "
                               f"({len(entry.get('measurements', []))} configs measured)")
            merged[key] = entry
    for key in list(merged):
        if _finished(records.get("entries", {}).get(key), merged[key]):
            del merged[key]
            if key in ours:
                changes.append(f"{name}: dropped the finished search's partial entry {key}")
    return merged, changes


def _configs(entry: dict) -> list:
    return [m.get("config") for m in (*entry.get("measurements", []), *entry.get("failures", []))]


def _finished(record: dict | None, partial: dict) -> bool:
    """The record holds the partial's search, finished: the same stack, and every config the partial measured (or
    saw fail) among the record's."""
    if record is None or not _same_stack(record.get("versions") or {}, partial.get("versions") or {}):
        return False
    done = _configs(record)
    return all(config in done for config in _configs(partial))


def _same_stack(record: dict, partial: dict) -> bool:
    """A partial search keeps the versions of the record's stack (cuda-tile, tileiras, triton, driver ...); the record
    may name more (torch): the same stack when every version the partial names is the record's."""
    return bool(partial) and all(record.get(name) == version for name, version in partial.items())


def take(archives: list[str | Path], tuning_dir: str | Path, dry_run: bool = False) -> list[str]:
    """Merges every archive into `tuning_dir`; returns the changes (none written when dry_run)."""
    root = Path(tuning_dir)
    files: dict[str, dict] = {}  # name -> content as merged so far
    before: dict[str, dict] = {}  # name -> content in the tree ({} where absent), read once

    def current(name: str) -> dict:
        if name not in files:
            files[name] = before[name] = tuning._read(root / name)
        return files[name]

    changes = []
    contents = [read_archive(a) for a in archives]
    for content in contents:  # records first: the partials are judged against every archive's records
        for name, data in sorted(content.items()):
            if not name.endswith(PARTIAL):
                files[name], done = merge_records(current(name), data, name)
                changes += done
    partial_names = {n for c in contents for n in c if n.endswith(PARTIAL)} | {
        str(p.relative_to(root)) for p in root.glob(f"*/*{PARTIAL}")}
    for name in sorted(partial_names):
        record = current(name[: -len(PARTIAL)] + ".json")
        merged = current(name)
        for content in contents:
            merged, done = merge_partials(merged, content.get(name, {}), record, name)
            changes += done
        files[name] = merged
    emptied = [n for n, data in files.items() if n.endswith(PARTIAL) and not data and (root / n).exists()]
    changes += [f"{name}: deleted (no unfinished search left)" for name in emptied]
    if dry_run:
        return changes
    for name in emptied:
        (root / name).unlink()
    for name, data in files.items():
        if data and data != before[name]:  # ({}: a record file read only to judge a partial, and absent)
            tuning._write(root / name, data)
    return changes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("archives", nargs="+", help="tuning.tar.gz files returned by GPU runs")
    parser.add_argument("--tuning", default=str(tuning.ROOT), help="the tree's tuning folder (default: %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="print the changes, write nothing")
    args = parser.parse_args(argv)
    for archive in args.archives:
        if not Path(archive).is_file():
            parser.error(f"archives: {archive} is not a file")
    changes = take(args.archives, args.tuning, args.dry_run)
    print("\n".join(changes) if changes else "nothing to take: the tree holds every record already")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
