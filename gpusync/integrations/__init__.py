"""Optional integrations with fbgemm-gpu and torchrec: used where installed, reported as
"not installed" where not (never an ImportError)."""
