"""Keeps secrets out of what the harness writes: the value of any environment variable whose name holds KEY,
TOKEN, SECRET or PASSWORD is replaced by a placeholder in result rows, the W&B config and the harness's messages.

The harness never reads such variables itself; this guards against their values arriving by another way (a
config interpolation such as `${oc.env:WANDB_API_KEY}`, an exception message quoting a URL with a token).
"""

from __future__ import annotations

import os
import re

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
PLACEHOLDER = "<redacted>"
MIN_LENGTH = 4  # shorter values ("1", "yes") would redact ordinary text without protecting anything


def secret_values() -> list[str]:
    """The values of the secret-named environment variables, longest first (so that one containing another is
    replaced whole)."""
    values = {v for k, v in os.environ.items() if SECRET_NAME.search(k) and len(v) >= MIN_LENGTH}
    return sorted(values, key=len, reverse=True)


def redact(obj, values: list[str] | None = None):
    """`obj` (a string, or dicts and lists of them, at any depth) with every secret value replaced."""
    values = secret_values() if values is None else values
    if not values:
        return obj
    if isinstance(obj, str):
        for value in values:
            obj = obj.replace(value, PLACEHOLDER)
        return obj
    if isinstance(obj, dict):
        return {redact(k, values): redact(v, values) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact(v, values) for v in obj)
    return obj
