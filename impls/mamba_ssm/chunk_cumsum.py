"""Stage 1 through mamba-ssm: `_chunk_cumsum_fwd` (returns dA_cumsum first; the contract returns dt first)."""


def chunk_cumsum(up, dt, A, chunk_size, dt_bias, dt_softplus, dt_limit):
    dA_cumsum, dt_out = up.ssd_chunk_state._chunk_cumsum_fwd(
        dt, A, chunk_size, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit)
    return dt_out, dA_cumsum
