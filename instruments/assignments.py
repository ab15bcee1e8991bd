"""`name=value` arguments of the instruments' command lines (switches, tile pins), each value read as a YAML scalar
(`true`/`True`, integers, floats, anything else a string), as instruments/host_profile.py reads its `--switches`
(which keeps its own reader: it runs against older trees that lack this package)."""

from __future__ import annotations


def parse_assignments(items: list[str], where: str) -> dict:
    """["name=value", ...] -> {name: value}; raises ValueError naming `where` (the option) and the item."""
    import yaml

    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ValueError(f"{where}: {item!r} is not name=value")
        out[name.strip()] = yaml.safe_load(value)
    return out
