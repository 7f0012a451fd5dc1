"""The ahead-of-time compile planner behind `python -m gpn_jax.aot` (the entry point only
parses flags): compiles a config's train step for devices this host does not have and reads
its per-device memory, the memory's HBM traffic and its per-token loop operations.

* `plan`: what the command does with its flags: target, compile or search, text or JSON, file.
* `search`: the batch search (`--find_max_batch`) and the listed batches, one trial each.
* `step`: compiles the train step from abstract inputs; XLA's memory analysis of it.
* `readout`: one compiled step's JSON record and text report.
* `targets`: the devices compiled for, their memory per device, the mesh sizes.
* `tpus`, `gpus`: the compile-only devices of a TPU slice (libtpu) and of NVIDIA GPUs (CUDA).
"""
