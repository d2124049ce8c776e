"""Built-in workloads. They are written like user code, syncs included: scanning them is the
point."""
