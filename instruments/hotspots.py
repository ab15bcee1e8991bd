"""Where one kernel's warps wait, instruction by instruction: Nsight Compute's warp-state sampling per SASS line.

    python -m instruments.hotspots --backend cutile --shape S1 --kernel compute_out_kernel [--ablation POINT]
                                   [--direction forward|backward|forward_backward] [--out DIR] [--top 40]

The target is instruments/profile.py's: the headline problem (bf16) at a conf/shape/ preset, the direction's call
(a forward by default; `--direction backward` for a backward kernel such as bwd_chunk_kernel) twice outside the
profiled range, once inside it. ncu (`--clock-control none`) collects the SourceCounters section (warp-state
sampling: at a fixed interval it records the instruction each sampled warp is at and why it did not issue) for the
first launch whose name matches --kernel in the profiled forward, into a report; the report's source page is then
printed as CSV, one row per SASS instruction (`ncu --import --page source --print-source sass --csv`), and
written whole to `hotspots-<backend>-<shape>-<kernel>-<ablation>.csv.gz` under --out (the columns as ncu names
them, plus kernel, backend, shape, ablation).

Printed: the instructions holding the most samples with the opcode, and the samples summed per opcode family
(`family`: LDL/STL are spill traffic, SYNCS the mbarrier waits on TMA copies, WARPGROUP the warpgroup-MMA waits,
HGMMA the MMAs, MUFU the exponentials, ...): the share of the kernel's stalls each kind of instruction holds,
which the per-kernel breakdown of instruments/profile.py cannot tell (docs/perf-notes.md uses both).
Exits 1 if ncu fails or profiles no matching kernel.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from instruments.profile import DIRECTIONS, PROFILED_MARK, ablation_switches, ncu
from instruments.sass import base_opcode

SAMPLES = "Warp Stall Sampling (All Samples)"  # the source page's column of every sample at the instruction
NOT_ISSUED = "Warp Stall Sampling (Not-issued Samples)"  # the samples whose warp did not issue

# opcode -> family, first match wins; what is not here is its own family (its opcode)
FAMILIES = (
    ("LDL", "spill load (LDL)"), ("STL", "spill store (STL)"),
    ("SYNCS", "mbarrier (SYNCS: TMA arrivals)"), ("WARPGROUP", "warpgroup MMA wait (WARPGROUP)"),
    ("HGMMA", "MMA (HGMMA)"), ("HMMA", "MMA (HMMA)"), ("MUFU", "MUFU (exp2, rcp)"),
    ("UTMALDG", "TMA load issue (UTMALDG)"), ("UTMASTG", "TMA store issue (UTMASTG)"),
    ("LDG", "global load (LDG)"), ("STG", "global store (STG)"), ("LDS", "shared load (LDS, LDSM)"),
    ("LDSM", "shared load (LDS, LDSM)"), ("STS", "shared store (STS, STSM)"), ("STSM", "shared store (STS, STSM)"),
    ("BAR", "barrier (BAR)"), ("FMUL", "fp32 arithmetic"), ("FADD", "fp32 arithmetic"), ("FFMA", "fp32 arithmetic"),
    ("FSEL", "fp32 arithmetic"), ("FSETP", "fp32 arithmetic"), ("F2FP", "conversion (F2FP, F2F)"),
    ("F2F", "conversion (F2FP, F2F)"),
)


def ncu_collect(backend: str, shape: str, ablation: str, kernel: str, report: Path,
                direction: str = "forward") -> list[str]:
    return [ncu(), "--clock-control", "none", "--profile-from-start", "off", "--target-processes", "all",
            "--section", "SourceCounters", "--kernel-name", f"regex:{kernel}", "--launch-count", "1",
            "--export", str(report), "--force-overwrite",
            sys.executable, "-m", "instruments.profile", "--target", backend, shape, ablation, direction]


def ncu_source_page(report: Path) -> list[str]:
    return [ncu(), "--import", str(report), "--page", "source", "--print-source", "sass", "--csv"]


def parse_source_csv(text: str) -> list[dict]:
    """ncu's source-page CSV -> one dict per SASS line: the text's own columns, numbers as float. The table starts
    at the header line holding "Address" and "Source"; lines before it (the kernel's name, ncu's notes) are
    skipped. Raises ValueError when there is no such header or no SAMPLES column."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if '"Address"' in line and '"Source"' in line), None)
    if start is None:
        raise ValueError("no source table (a header with \"Address\" and \"Source\") in ncu's output")
    rows = []
    for raw in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if not (raw.get("Address") or "").strip():
            continue
        row = {}
        for key, value in raw.items():
            if key is None:
                continue
            row[key] = _number(value)
        rows.append(row)
    if rows and SAMPLES not in rows[0]:
        raise ValueError(f"no {SAMPLES!r} column in ncu's source table (columns: {list(rows[0])})")
    return rows


def _number(value):
    text = (value or "").replace(",", "").strip()
    try:
        return float(text)
    except ValueError:
        return value


def family(op: str) -> str:
    return next((name for prefix, name in FAMILIES if op == prefix), op or "?")


def by_family(rows: list[dict]) -> list[tuple[str, float, float]]:
    """(family, samples, share of all samples in %), most samples first."""
    total = sum(float(r.get(SAMPLES) or 0) for r in rows)
    counts: Counter = Counter()
    for r in rows:
        counts[family(base_opcode(str(r.get("Source", ""))))] += float(r.get(SAMPLES) or 0)
    return [(name, n, 100.0 * n / total if total else float("nan")) for name, n in counts.most_common()]


def top_lines(rows: list[dict], n: int) -> list[dict]:
    return sorted(rows, key=lambda r: -float(r.get(SAMPLES) or 0))[:n]


def report_text(rows: list[dict], top: int) -> str:
    total = sum(float(r.get(SAMPLES) or 0) for r in rows)
    out = [f"{len(rows)} SASS lines, {total:.0f} samples", "samples by opcode family:"]
    out += [f"  {name:36} {n:9.0f}  {share:5.1f} %" for name, n, share in by_family(rows)]
    out.append(f"the {top} lines with the most samples (address, samples, not issued, share, instruction):")
    for r in top_lines(rows, top):
        n = float(r.get(SAMPLES) or 0)
        share = 100.0 * n / total if total else float("nan")
        out.append(f"  {r.get('Address')!s:>8} {n:8.0f} {float(r.get(NOT_ISSUED) or 0):8.0f} {share:5.1f} %  "
                   f"{str(r.get('Source', ''))[:90]}")
    return "\n".join(out)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def write_rows(rows: list[dict], path: Path, extra: dict) -> None:
    """The rows as CSV, `extra`'s columns first; gzipped when the name ends in .gz (a kernel's page is about 1 MB)."""
    columns = list(extra) + [k for k in rows[0] if k not in extra]
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        for r in rows:
            writer.writerow({**extra, **r})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cutile")
    parser.add_argument("--shape", default="S1")
    parser.add_argument("--kernel", required=True, help="regex on the kernel's name; the first match is profiled")
    parser.add_argument("--ablation", default="none", help="an ablation point (harness/config.py grammar)")
    parser.add_argument("--direction", choices=DIRECTIONS, default="forward",
                        help="the call whose kernel is sampled: the forward, the backward, or both")
    parser.add_argument("--out", default="results/scratch/hotspots")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--timeout", type=int, default=300)
    args = parser.parse_args(argv)
    from harness.config import ConfigError

    try:
        ablation_switches(args.backend, args.ablation)
    except ConfigError as err:
        parser.error(f"--ablation: {err}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "hotspots.ncu-rep"
        res = subprocess.run(ncu_collect(args.backend, args.shape, args.ablation, args.kernel, report, args.direction),
                             capture_output=True, text=True, timeout=args.timeout, env=os.environ)
        if PROFILED_MARK not in res.stdout + res.stderr or not report.exists():
            print(f"[hotspots] the target or ncu failed: {(res.stdout + res.stderr)[-1500:]}", flush=True)
            return 1
        page = subprocess.run(ncu_source_page(report), capture_output=True, text=True, timeout=args.timeout)
    try:
        rows = parse_source_csv(page.stdout)
    except ValueError as err:
        print(f"[hotspots] {err}; ncu said: {(page.stdout + page.stderr)[:1500]}", flush=True)
        return 1
    if not rows:
        print(f"[hotspots] no kernel matching {args.kernel!r} was profiled", flush=True)
        return 1
    kernel_name = next((line for line in page.stdout.splitlines() if line.strip() and '"Address"' not in line), "")
    extra = {"backend": args.backend, "shape_name": args.shape, "ablation": args.ablation, "kernel": args.kernel,
             "direction": args.direction}
    parts = ["hotspots", args.backend, args.shape, slug(args.kernel), slug(args.ablation)]
    parts += [] if args.direction == "forward" else [args.direction]
    name = "-".join(parts) + ".csv.gz"
    write_rows(rows, out / name, extra)
    print(f"[hotspots] {args.backend} {args.shape} {args.ablation} {args.direction} {args.kernel}: "
          f"{kernel_name[:120]}", flush=True)
    print(report_text(rows, args.top), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
