"""Foundation I/O shared by data/, training/, eval/ and interop/: local or `gs://` paths and
atomic file writes. Imports nothing of gpn_jax above it."""
