"""Reading and writing runs: everything a run leaves on disk, and nothing about training.

* `manager`     - orbax checkpoints (`Checkpointer`): save, restore, per-leaf checksums,
                  skipping and moving aside damaged steps.
* `checksums`   - the per-array checksums each step carries, verified on restore.
* `failures`    - damage or not, one-line errors, orbax's log noise filtered.
* `restore`     - a trained run loaded back from its workdir (`load_run`), parameters only.
* `model_dir`   - exported model directories (safetensors + config.json), read and written.
* `model_card`  - the README.md of an exported model directory.
* `paper_pickle`- the paper code's checkpoint pickle <-> our parameters.

Every file read here is untrusted: schemas and sizes are checked before use, no path leaves
its directory, nothing executes. Training, evaluation, analysis and export import this
package; it imports nothing of theirs.
"""
