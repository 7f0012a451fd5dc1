"""Round trip with the paper code's checkpoint pickle layout (names as in its sot_m / sot models)."""

import os
import pickle
import warnings

import jax
import numpy as np
import optax
import pytest

from gpn_jax.checkpoints import paper_pickle
from gpn_jax.models.gpn import GPN, GPNConfig
from tests.helpers.window import BASE, random_params, tokens


def tiny(**kw) -> GPNConfig:
    return GPNConfig(**(BASE | kw))


# Parameter names the paper's Flax modules declare (read off its sot_m / sot model files).
PAPER_SOT_M_SHARED = {
    "embedding",
    "decode_norm_w",
    "decode_proj_k",
    "fuse_norm_w",
    "fuse_proj_k",
    "fg_norm_w",
    "fg_gate_k",
    "fg_gate_b",
    "write_norm_w",
    "write_W_k_k",
    "write_W_k_b",
    "write_W_v_k",
    "write_W_beta_k",
    "write_A_log",
    "write_dt_bias",
    "write_W_a_k",
}
PAPER_LAYER = {
    "ffn_norm_w",
    "ffn_w1_k",
    "ffn_w2_k",
    "pg_norm_w",
    "pg_gate_k",
    "pg_gate_b",
    "read_norm_w",
    "read_W_q_k",
    "read_W_q_b",
    "read_W_gate_k",
    "read_out_norm_w",
    "read_W_o_k",
}
PAPER_SOT = {
    "embedding",
    "decode_norm_w",
    "decode_proj_k",
    "ffn_norm_w",
    "ffn_w1_k",
    "ffn_w2_k",
    "pg_norm_w",
    "pg_gate_k",
    "pg_gate_b",
    "fuse_norm_w",
    "fuse_proj_k",
    "fg_norm_w",
    "fg_gate_k",
    "fg_gate_b",
}


def paper_optimizer(params):
    """The paper trainer's optimiser chain, built on its own (paper-named) parameter dict."""
    mask = jax.tree.map(lambda x: x.ndim >= 2, params)
    sched = optax.warmup_cosine_decay_schedule(0.0, 6e-4, 100, 10_000, 6e-5)
    return optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=0.1, mask=mask)
    )


@pytest.mark.parametrize("n_layers", [1, 2])
def test_paper_names_for_gpn_m(n_layers):
    params = GPN(tiny(n_layers=n_layers)).init(jax.random.PRNGKey(0))
    layers = {f"L{i}_{n}" for i in range(n_layers) for n in PAPER_LAYER}
    assert set(paper_pickle.to_paper_params(params)) == PAPER_SOT_M_SHARED | layers


def test_paper_ffn_w1_is_gate_then_up():
    """The paper's one (d, 2F) [gate | up] matrix is our separate w1 (gate) and w3 (up)."""
    params = GPN(tiny()).init(jax.random.PRNGKey(0))
    lp = params["layer_0"]
    d, f = lp["w1"].shape
    fused = paper_pickle.to_paper_params(params)["L0_ffn_w1_k"]
    assert fused.shape == (d, 2 * f)
    np.testing.assert_array_equal(fused[:, :f], lp["w1"])
    np.testing.assert_array_equal(fused[:, f:], lp["w3"])


def test_paper_names_for_gpn_without_memory():
    params = GPN(tiny(memory=False, n_heads=0, d_key=0, d_value=0)).init(jax.random.PRNGKey(0))
    assert set(paper_pickle.to_paper_params(params)) == PAPER_SOT


@pytest.mark.parametrize(
    "memory,protocol", [(True, pickle.DEFAULT_PROTOCOL), (True, 2), (True, 5), (False, 4)]
)
def test_load_a_paper_pickle(tmp_path, memory, protocol):
    kw = {} if memory else dict(memory=False, n_heads=0, d_key=0, d_value=0)
    model = GPN(tiny(n_layers=1 if not memory else 2, **kw))
    ours = random_params(model)
    # A pickle as the paper's trainer writes it: its names, its optimiser, numpy leaves.
    paper_params = paper_pickle.to_paper_params(ours)
    opt = paper_optimizer(paper_params)
    opt_state = opt.init(paper_params)
    grads = jax.tree.map(np.ones_like, paper_params)
    _, opt_state = jax.jit(opt.update)(grads, opt_state, paper_params)  # one program, not ~300 ops
    ckpt = {
        "step": 7,
        "data_position": 21,
        "params": paper_params,
        "opt_state": jax.tree.map(np.asarray, opt_state),
    }
    (tmp_path / "run_7").mkdir()
    with open(tmp_path / "run_7" / "checkpoint.pkl", "wb") as f:
        pickle.dump(ckpt, f, protocol=protocol)

    loaded = paper_pickle.load(str(tmp_path / "run_7"))
    assert (loaded["step"], loaded["data_position"]) == (7, 21)
    jax.tree.map(np.testing.assert_array_equal, loaded["params"], jax.device_get(ours))
    x = tokens(8)
    loss = jax.jit(lambda p: model.loss(p, x)[0])
    np.testing.assert_array_equal(loss(loaded["params"]), loss(ours))
    # Moments are keyed by our names now, in the structure our own optimiser would build.
    our_state = paper_optimizer(ours).init(ours)
    assert jax.tree.structure(loaded["opt_state"]) == jax.tree.structure(our_state)


def test_unknown_paper_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown parameter 'L0_mystery'"):
        paper_pickle.from_paper_params({"L0_mystery": np.zeros(3)})


class _Payload:
    """Unpickling this calls `fn(*args)`: how a hostile pickle runs code."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


@pytest.mark.parametrize("how", ["open", "system"])
def test_a_pickle_that_would_run_code_is_refused_and_runs_nothing(tmp_path, how):
    def payload(target):
        if how == "open":  # open(path, "w") creates the file
            return _Payload(open, str(target), "w"), f"{open.__module__}.open"
        return _Payload(os.system, f"touch {target}"), f"{os.system.__module__}.system"

    # The payload is live: plain pickle creates the file.
    live, _ = payload(tmp_path / "made_by_plain_pickle")
    pickle.loads(pickle.dumps({"step": live}))
    assert (tmp_path / "made_by_plain_pickle").exists()

    target = tmp_path / "pwned"
    bad, name = payload(target)
    path = tmp_path / "checkpoint.pkl"
    with open(path, "wb") as f:  # hidden inside an otherwise plausible checkpoint
        pickle.dump({"step": 1, "data_position": 0, "params": {}, "opt_state": (bad,)}, f)
    with pytest.raises(ValueError) as e:
        paper_pickle.load(str(tmp_path))
    assert str(e.value) == f"refusing to load {path}: global {name!r} is not allowed"
    assert not target.exists()


def test_a_numpy_1_pickle_loads(tmp_path):
    """numpy 1.x writes `numpy.core.multiarray`, numpy 2.x `numpy._core.multiarray`."""
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "s": np.float32(2.5)}
    data = pickle.dumps(arrays, protocol=2)  # protocol 2 names globals as text lines
    old = data.replace(b"numpy._core.", b"numpy.core.")
    assert b"numpy.core.multiarray\n_reconstruct" in old
    path = tmp_path / "old.pkl"
    path.write_bytes(old)
    back = paper_pickle.read_pickle(str(path))
    np.testing.assert_array_equal(back["a"], arrays["a"])
    assert back["s"] == arrays["s"] and back["s"].dtype == np.float32


def test_a_truncated_pickle_is_one_line(tmp_path):
    path = tmp_path / "checkpoint.pkl"
    path.write_bytes(pickle.dumps({"step": np.zeros(4)})[:-9])
    with pytest.raises(ValueError, match=r"is not a readable paper checkpoint") as e:
        paper_pickle.load(str(path))
    assert "\n" not in str(e.value)


def _good_checkpoint(**changes) -> dict:
    ckpt = {
        "step": 3,
        "data_position": 6,
        "params": {"embedding": np.zeros((4, 2), np.float32)},
        "opt_state": (),
    }
    return ckpt | changes


@pytest.mark.parametrize(
    "ckpt, message",
    [
        ({**_good_checkpoint(), 7: 1}, "a key that is not a string (7)"),
        (_good_checkpoint(step=None), "its step is None, not a non-negative integer"),
        (_good_checkpoint(step=-1), "its step is -1"),
        (_good_checkpoint(data_position="x"), "its data_position is 'x'"),
        (_good_checkpoint(params={1: np.zeros(2)}), "parameter name 1 is not a string"),
        (_good_checkpoint(params={"embedding": [1.0]}), "'embedding' is a list, not a numeric"),
        (_good_checkpoint(params={"": np.zeros(2)}), "parameter name '' is not a string"),
        (_good_checkpoint(params={}), "its params are not a non-empty dict"),
    ],
    ids=["int_key", "step_none", "step_negative", "position_str", "param_int_name",
         "param_list", "param_empty_name", "no_params"],
)  # fmt: skip
def test_a_malformed_checkpoint_is_one_line(tmp_path, ckpt, message):
    path = tmp_path / "checkpoint.pkl"
    path.write_bytes(pickle.dumps(ckpt))
    with pytest.raises(ValueError) as e:
        paper_pickle.load(str(path))
    assert str(e.value).startswith(f"{path} is not a paper checkpoint: ")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_directory_in_place_of_the_pickle_is_one_line(tmp_path):
    (tmp_path / "checkpoint.pkl").mkdir()
    with pytest.raises(ValueError, match=r"checkpoint\.pkl is a directory, not a paper"):
        paper_pickle.load(str(tmp_path))


def test_an_unknown_codec_is_refused(tmp_path):
    """Protocol 2 writes bytes as `_codecs.encode(text, 'latin1')`; any other codec (zlib,
    hex, ...) would run a decoder on the file's say-so."""
    data = pickle.dumps(b"\x00\x01", protocol=2).replace(b"latin1", b"zlib_c")
    path = tmp_path / "codec.pkl"
    path.write_bytes(data)
    with pytest.raises(ValueError, match="_codecs.encode with codec 'zlib_c' is not allowed"):
        paper_pickle.read_pickle(str(path))


class _Alloc:
    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def test_a_dtype_string_numpy_would_parse_as_code_is_one_line(tmp_path):
    """numpy parses long dtype strings with `ast.literal_eval` ('04' raised SyntaxError
    through the loader, a fuzz find): only a type code or name is accepted."""
    data = pickle.dumps(np.zeros(2, np.float32), protocol=2).replace(b"f4", b"04")
    path = tmp_path / "dtype.pkl"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=r"numpy.dtype '04' \(only a numeric type code or name"):
        paper_pickle.read_pickle(str(path))


def test_dtype_flags_that_are_not_0_or_1_are_one_line_and_warn_nothing(tmp_path):
    """`numpy.dtype(spec, align, copy)` with a string flag (a fuzz find) made numpy warn about a
    deprecated argument instead of the reader refusing the file; numpy's own flags load."""
    path = tmp_path / "dtype.pkl"
    path.write_bytes(pickle.dumps(_Alloc(np.dtype, "f4", "4", 1), protocol=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"numpy.dtype arguments \['4', 1\] \(only the alig"):
            paper_pickle.read_pickle(str(path))
    path.write_bytes(pickle.dumps(np.dtype("<f4"), protocol=2))  # numpy's dtype('f4', 0, 1)
    assert paper_pickle.read_pickle(str(path)) == np.float32


@pytest.mark.parametrize(
    "payload, what",
    [
        (_Alloc(bytearray, 2**31 - 1), "builtins.bytearray of 2147483647 bytes"),
        (_Alloc(np.ndarray, (2**20, 2**10)), "numpy.ndarray of 8589934592 bytes"),
        (_Alloc(np.dtype, "O"), "numpy.dtype '|O' (only numeric dtypes are data)"),
    ],
    ids=["bytearray", "ndarray", "object_dtype"],
)
def test_allocations_are_capped_by_the_file_size(tmp_path, payload, what):
    """A few dozen bytes asking for gigabytes are refused before anything is allocated: a fresh
    process that reads the file peaks below the 2 GiB asked for. Its peak is the kernel's
    VmHWM, which starts afresh at exec (getrusage's ru_maxrss would carry the forking test
    worker's peak into the child)."""
    import subprocess
    import sys

    path = tmp_path / "alloc.pkl"
    path.write_bytes(pickle.dumps(payload, protocol=4))
    assert path.stat().st_size < 200
    if not os.path.exists("/proc/self/status"):
        pytest.skip("needs Linux's /proc/self/status for the process's own peak")
    code = (
        "import sys\n"
        "from gpn_jax.checkpoints import paper_pickle\n"
        "try:\n"
        "    paper_pickle.read_pickle(sys.argv[1])\n"
        "except ValueError as e:\n"
        "    print(e)\n"
        "hwm = [ln for ln in open('/proc/self/status') if ln.startswith('VmHWM:')]\n"
        "print(int(hwm[0].split()[1]) * 1024)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    *message, peak = proc.stdout.strip().splitlines()
    assert f"refusing to load {path}: {what}" in "\n".join(message)
    assert int(peak) < 2**31  # the process never held the 2 GiB it was asked for
