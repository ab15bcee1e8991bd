"""cuTile inspection: ahead-of-time compiles, spills, golden SASS hashes, the switch-effects table."""
