"""The pipeline: configs, plan → gate → time → record, the store, provenance, tuning records and defaults, scripts."""
