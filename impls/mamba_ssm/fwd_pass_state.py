"""Stage 2 through mamba-ssm: `_chunk_state_fwd` (fp32 chunk-local states) then `_state_passing_fwd`."""

from einops import rearrange

from impls.mamba_ssm.layout import upstream_layout


def fwd_pass_state(up, B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype):
    B, x = upstream_layout(B=B, x=x)
    local = up.ssd_chunk_state._chunk_state_fwd(B, x, dt, dA_cumsum, seq_idx=seq_idx, states_in_fp32=True)
    dstate = B.shape[-1]
    flat_init = rearrange(initial_states, "... p n -> ... (p n)") if initial_states is not None else None
    states, final = up.ssd_state_passing._state_passing_fwd(
        rearrange(local, "... p n -> ... (p n)"), dA_cumsum[:, :, :, -1], initial_states=flat_init,
        seq_idx=seq_idx, chunk_size=dt.shape[-1], out_dtype=state_dtype or x.dtype)
    return (rearrange(states, "... (p n) -> ... p n", n=dstate), rearrange(final, "... (p n) -> ... p n", n=dstate))
