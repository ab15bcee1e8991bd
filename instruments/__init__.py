"""Instruments that look at the kernels from outside the pipeline: profilers, sanitizers, SASS/PTX readers, switch
effect tables, tuning-record tools. Neither the pipeline (harness/) nor the backends (impls/) import this package."""
