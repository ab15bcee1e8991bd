"""The reference backend: vectorised PyTorch stages for any dtype and device (float64 capable), checked against
the sequential recurrence in `sequential.py`, which is the definition."""

from impls.reference.backend import ReferenceBackend  # noqa: F401  (registers "reference")
from impls.reference.chunk_cumsum import chunk_cumsum, process_dt  # noqa: F401
from impls.reference.compute_out import compute_out  # noqa: F401
from impls.reference.fwd_pass_state import fwd_pass_state  # noqa: F401
from impls.reference.sequential import ssd_sequential  # noqa: F401
from impls.reference.varlen import varlen_states  # noqa: F401

# The declaration, read without importing this package (impls/declaration.py, docs/add-a-backend.md).
BACKEND = "reference"
# result column v_<key> -> (distribution, pin or None: recorded only)
PACKAGES = {"torch": ("torch", ">=2.11")}
