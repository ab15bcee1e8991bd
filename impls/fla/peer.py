"""The one call into FLA: `fla.ops.simple_gla.chunk_simple_gla` (Triton), imported on first use."""

from __future__ import annotations

from impls.declaration import declared

VERSION_REQUIRED = declared("fla").pin("fla-core")  # impls/fla/__init__.py PACKAGES
FLA_DEFAULT_CHUNK = 64  # chunk_simple_gla's chunk when none is passed (ChunkSimpleGLAFunction.forward)


def version() -> str | None:
    try:
        from importlib.metadata import version as _v

        return _v("fla-core")
    except Exception:
        return None


def load():
    from fla.ops.simple_gla import chunk_simple_gla

    return chunk_simple_gla


def run(args):
    """(o (b, t, h, p) in q's dtype, final states (N, h, n, p) fp32 — (N, h, p, n) with state_v_first)."""
    return load()(args.q, args.k, args.v, g=args.g, scale=args.scale, initial_state=args.initial_state,
                  output_final_state=True, state_v_first=args.state_v_first, cu_seqlens=args.cu_seqlens,
                  chunk_size=args.chunk_size)
