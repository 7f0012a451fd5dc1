"""The synthetic suite: MAD's six tasks, MQAR and state tracking for every model family.

    python -m experiments.synthetic --config=experiments/configs/synthetic_small.py --workdir=DIR

Per (task, family) cell, one process-wide compiled program trains every (learning rate, seed)
run of the cell side by side (`jax.vmap` over stacked parameters and optimiser states), picks
the learning rate with the best mean validation accuracy and reports that rate's test accuracy
over seeds (and, for state tracking, accuracy at longer test lengths). The models are
`gpn_jax.models.factory`'s variants at matched parameter counts. Modules: `runner` (the
vmapped training and scoring), `suite` (cells, resume, progress, model blocks), `report`
(tables, plot, result files).
"""
