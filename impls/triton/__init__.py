"""The Triton backend ("triton"): Mamba-2 SSD forward stages written in Triton the way the cuTile backend is
written (same stages, layouts and operand orders). Importing this package registers the backend.

`import triton` inside this package is an absolute import: it reaches the real Triton, not this package.
"""

from impls.triton.backend import TritonBackend  # noqa: F401  (registers "triton")

# The declaration, read without importing this package (impls/declaration.py, docs/add-a-backend.md).
BACKEND = "triton"
# result column v_<key> -> (distribution, pin or None: recorded only)
PACKAGES = {"torch": ("torch", ">=2.11"), "triton": ("triton", "3.6.*")}
