"""Offline tools, never imported by the server: profiling the device, building, training and
evaluating the draft. Run from the repository root, e.g. `python -m tools.profile`."""
