"""The upstream mamba-ssm 2.3.2.post1 Triton kernels behind the contract (backend "mamba_ssm")."""

from impls.mamba_ssm.backend import MambaSSMBackend  # noqa: F401  (registers "mamba_ssm")
