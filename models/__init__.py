"""Model-level modules built on the SSD interface (`impls.ssd_forward`): a whole Mamba-2 layer around the SSD, so
that a backend can be timed inside the layer a model runs. They live here, beside `impls/` rather than in it,
because every folder under `impls/` is a backend (impls/declaration.py); these modules only call one.

    from models.mamba2 import Mamba2, Mamba2Config
    layer = Mamba2(Mamba2Config(d_model=2560, headdim=64), backend="triton", device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        out = layer(u)                       # u (batch, seqlen, d_model)

    from models.mamba2_lm import Mamba2LM, preset     # the language model on that layer, released sizes by name
    model = Mamba2LM(preset("mamba2_130m"), backend="triton", device="cuda", dtype=torch.bfloat16)
    loss = model.loss(input_ids)                      # next-token cross-entropy; loss.backward() trains

The parts around the SSD (the conv + SiLU, the gated norm) run as `glue` says (models/glue.py): "torch" (default),
"triton" (our kernels, models/kernels/) or "compile"; `Mamba2(..., glue="triton")`, `Mamba2LM(..., glue="triton")`.
Their floor at a size and a card's rates: models/floor.py.

A short training run on associative recall (loss curves per backend): models/recall.py, models/train.py; the same
step under DistributedDataParallel (gloo on the CPU, NCCL on CUDA): models/ddp.py.
Upstream's `MambaLMHeadModel` (mamba-ssm) with a Mamba2LM's config and weights, to compare against:
models/upstream.py (`upstream_from(model)`).
"""
