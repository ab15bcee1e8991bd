"""Each backend's own paths on the CPU: Triton under the interpreter, cuTile compiled ahead of time, the peers."""
