"""The upstream mamba-ssm 2.3.2.post1 Triton kernels behind the contract (backend "mamba_ssm")."""

from impls.mamba_ssm.backend import MambaSSMBackend  # noqa: F401  (registers "mamba_ssm")

# The declaration, read without importing this package (impls/declaration.py, docs/add-a-backend.md).
BACKEND = "mamba_ssm"
# result column v_<key> -> (distribution, pin or None: recorded only)
PACKAGES = {"torch": ("torch", ">=2.11"), "triton": ("triton", "3.6.*"), "mamba_ssm": ("mamba-ssm", "2.3.2.post1")}
