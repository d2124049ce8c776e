"""Built-in workload profiles (YAML), installed as the gpusync.builtin_profiles package."""
