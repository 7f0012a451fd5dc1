"""Foundation I/O shared by data/, training/, eval/ and checkpoints/: local or `gs://` paths and
atomic file writes. Imports nothing of gpn_jax above it."""
