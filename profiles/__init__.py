"""Built-in workload profiles (YAML), installed as the gpusync.profiles package."""
