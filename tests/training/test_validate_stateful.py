"""Bad input to stateful training (`train.carry_state`): one line naming the field, before any
work, from `validate.check_config` and through the command line's `cli.run_or_exit`."""

import pytest

from experiments.configs import gdn_tiny, gpn_m_tiny, transformer_tiny
from gpn_jax.io import cli
from gpn_jax.training import validate

TRANSFORMER = "config.train.carry_state=true needs a recurrent model (family gpn or gdn)"
LAYOUT = "config.data.train_layout must be 'streams' (or '' for automatic), got 'shuffled'"
SPLIT = (
    "config.train.carry_state=true: the 6 streams (one per batch row, config.train.batch_size) "
    "must split evenly over grad_accum x data-parallel devices = 1 x 4"
)


def stateful(module=gpn_m_tiny, **data):
    c = module.get_config()
    c.train.carry_state = True
    c.data.update(data)
    return c


@pytest.mark.parametrize("module", [gpn_m_tiny, gdn_tiny])
def test_recurrent_models_with_the_automatic_or_streams_layout_pass(module):
    validate.check_config(stateful(module), data_parallel=4)
    validate.check_config(stateful(module, train_layout="streams"), data_parallel=4)


def bad_configs():
    uneven = stateful()
    uneven.train.batch_size = 6
    return [
        (stateful(transformer_tiny), 1, TRANSFORMER),
        (stateful(train_layout="shuffled"), 1, LAYOUT),
        (uneven, 4, SPLIT),
    ]


@pytest.mark.parametrize("case", range(3), ids=["transformer", "shuffled", "batch_split"])
def test_bad_stateful_config_is_one_line(case):
    config, data_parallel, message = bad_configs()[case]
    with pytest.raises(ValueError) as err:
        validate.check_config(config, data_parallel)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("case", range(3), ids=["transformer", "shuffled", "batch_split"])
def test_bad_stateful_config_through_the_cli_exits_1_with_one_line(case, capsys):
    config, data_parallel, message = bad_configs()[case]
    with pytest.raises(SystemExit) as exit_:
        cli.run_or_exit(validate.check_config, config, data_parallel, prog="gpn_jax.train")
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpn_jax.train: error: ") and message in err
