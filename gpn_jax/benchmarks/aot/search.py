"""The batch search of `python -m gpn_jax.aot`: compiles per-device batches of a config's train
step, one trial each, to find the largest that fits the device's memory, or the listed ones.

The search (`--find_max_batch`) compiles the config's per-device batch, then twice it, fits
a line through their peak bytes and compiles the largest multiple of 8 the line says fits,
stepping by 8 until one batch fits and the next does not (or `max_trials` compiles ran). Every
compile is a trial in the result, so the bracket it found is on record.
"""

from gpn_jax.benchmarks.aot import readout, step
from gpn_jax.benchmarks.aot.targets import GiB


def _with_batch(config, per_device: int, data_parallel: int):
    c = config.copy_and_resolve_references()
    c.train.batch_size = per_device * data_parallel
    return c


def _data_parallel(sizes: dict, n_devices: int) -> int:
    known = [v for v in sizes.values() if v > 0]
    rest = n_devices
    for v in known:
        rest //= v
    d = sizes.get("data", 1)
    return (rest if d == -1 else d) * max(1, sizes.get("fsdp", 1))


def compile_one(config, devices, sizes, memory_bytes):
    """(record, text report) of one compile."""
    result = step.compile_train_step(config, devices, sizes)
    report = step.memory_report(result, memory_bytes)
    record = readout.step_record(config, result, report, memory_bytes)
    return record, readout.format_report(config, result, report, memory_bytes)


def _next_batch(trials: list[dict], memory_bytes: int, stride: int) -> int | None:
    """The next per-device batch to try, or None when the bracket is found: the batch a line
    through the two latest peaks (fitting or not) says fills the memory, a multiple of
    `stride` strictly inside the bracket (else its middle)."""
    fit = [t["batch_per_device"] for t in trials if t["fits"]]
    fail = [t["batch_per_device"] for t in trials if not t["fits"]]
    lo, hi = max(fit, default=0), min(fail, default=None)
    if hi is not None and hi - lo <= stride:
        return None
    sized = [(t["batch_per_device"], t["peak_bytes_per_device"]) for t in trials]
    sized = sorted(x for x in sized if x[1])
    if len(sized) >= 2:
        (b0, p0), (b1, p1) = sized[-2], sized[-1]
        slope = (p1 - p0) / (b1 - b0) if b1 != b0 else 0
        guess = b1 + int((memory_bytes - p1) / slope) if slope > 0 else 2 * b1
    elif sized:  # one peak: taken as proportional to the batch
        b1, p1 = sized[0]
        guess = int(b1 * memory_bytes / p1)
    else:
        guess = 2 * lo if lo else stride
    guess = guess // stride * stride
    if hi is not None and not lo < guess < hi:
        guess = (lo + hi) // 2 // stride * stride
    guess = max(guess, lo + stride) if lo else max(guess, stride)
    if hi is not None and guess >= hi:
        return None
    return None if any(t["batch_per_device"] == guess for t in trials) else guess


def _trial(config, batch: int, dp: int, devices, sizes, memory_bytes, log) -> dict:
    """The record of one compile at per-device `batch`, logged as one line."""
    record, _ = compile_one(_with_batch(config, batch, dp), devices, sizes, memory_bytes)
    peak, vmem = record["peak_bytes_per_device"], record["m_in_vmem"]
    log(
        f"  per-device batch {batch}: {'fits' if record['fits'] else 'does NOT fit'}"
        + (f", peak {peak / GiB:.2f} GiB" if peak else "")
        + (f", M in VMEM: {vmem}" if vmem is not None else "")
        + f", {record['compile_seconds']} s"
    )
    return record


def find_max_batch(config, devices, sizes, memory_bytes, max_trials: int, log, save=None) -> dict:
    """Compiles per-device batches until the largest that fits is bracketed within 8;
    `save(result)` after each compile keeps what was found if a later one is cut off."""
    dp = _data_parallel(sizes, len(devices))
    batch = max(1, config.train.batch_size // dp)
    trials = []
    while batch is not None and len(trials) < max_trials:
        trials.append(_trial(config, batch, dp, devices, sizes, memory_bytes, log))
        batch = _next_batch(trials, memory_bytes, 8)
        if save:
            save(_search_result(trials, complete=batch is None))
    return _search_result(trials, complete=batch is None)


def compile_batches(config, devices, sizes, memory_bytes, batches, log, save=None) -> dict:
    """One compile per per-device batch of `batches`, each a trial of the result."""
    dp = _data_parallel(sizes, len(devices))
    trials = []
    for batch in batches:
        trials.append(_trial(config, batch, dp, devices, sizes, memory_bytes, log))
        if save:
            save(_search_result(trials, complete=False))
    return _search_result(trials, complete=True)


def _search_result(trials: list[dict], complete: bool) -> dict:
    fit = [t for t in trials if t["fits"]]
    fail = [t["batch_per_device"] for t in trials if not t["fits"]]
    vmem = [t["batch_per_device"] for t in fit if t["m_in_vmem"]]
    best = max(fit, key=lambda t: t["batch_per_device"], default=None)
    return {
        "largest_fitting_batch_per_device": best["batch_per_device"] if best else None,
        "smallest_failing_batch_per_device": min(fail, default=None),
        "largest_batch_with_m_in_vmem": max(vmem, default=None),  # of those compiled
        "smallest_batch_with_m_in_hbm": min(
            (t["batch_per_device"] for t in trials if t["m_in_vmem"] is False), default=None
        ),
        "fits": best is not None,
        "search_complete": complete,
        **{k: v for k, v in (best or trials[-1]).items() if k not in ("fits", "batch_size")},
        "trials": trials,
    }
