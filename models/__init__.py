"""Model-level modules built on the SSD interface (`impls.ssd_forward`): a whole Mamba-2 layer around the SSD, so
that a backend can be timed inside the layer a model runs. They live here, beside `impls/` rather than in it,
because every folder under `impls/` is a backend (impls/declaration.py); these modules only call one.

    from models.mamba2 import Mamba2, Mamba2Config
    layer = Mamba2(Mamba2Config(d_model=2560, headdim=64), backend="triton", device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        out = layer(u)                       # u (batch, seqlen, d_model)
"""
