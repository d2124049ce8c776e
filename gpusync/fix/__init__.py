"""`gpusync fix`: a verified patch for every sync that has a mechanical remedy. engine.py
proposes (the remedies, gpusync/remedies/) and verifies (runner.py: the patched copy scanned
and run with the original's seeds; sites.py and compare.py judge it); diff.py writes the patch,
write.py applies it.

Nothing is imported here: the fix renderer needs only diff.py and result.py, and the `gpusync`
command's process renders without importing torch (tests/unit/test_torch_free.py)."""
