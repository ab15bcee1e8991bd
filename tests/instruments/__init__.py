"""The instruments package: profilers, sanitizer, SASS/PTX goldens, launch interception, tuning take/backfill."""
