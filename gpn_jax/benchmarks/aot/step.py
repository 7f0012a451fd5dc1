"""Compiles a config's train step ahead of time and reads XLA's memory analysis of it.

`compile_train_step` builds the step with the code training uses (`training.setup.build`,
the config's sharding rules) on a mesh over the given devices (`targets`), lowers it from
abstract inputs and compiles it. A compile that runs out of device memory is a result
(`fits: false`, XLA's message), not an error.
"""

import contextlib
import math
import time

_OOM = ("resource_exhausted", "ran out of memory", "out of memory")


@contextlib.contextmanager
def _uncached(compile_only: bool):
    """No persistent-cache entry for an executable of compile-only devices (a TPU topology's):
    JAX cannot load one back and warns about it on every later compile of the program."""
    import jax

    if not compile_only:
        yield
        return
    before = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", math.inf)
    try:
        yield
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before)


def _out_of_memory(error: Exception) -> bool:
    return any(m in str(error).lower() for m in _OOM)


def compile_train_step(config, devices: list, mesh_sizes: dict):
    """Compiles `config`'s train step on a mesh over `devices` from abstract inputs.

    Returns a dict: the compiled step (None when the compile ran out of device memory, with
    `oom` holding XLA's message), mesh, model, abstract state, per-device state bytes, compile
    seconds.
    """
    import jax
    import ml_collections

    from gpn_jax.models import factory
    from gpn_jax.parallel import mesh as meshlib
    from gpn_jax.training import setup

    mesh = meshlib.make_mesh(ml_collections.ConfigDict(dict(mesh_sizes)), devices)
    # the kernels resolved for the devices compiled for, not for this host
    model = factory.build_model(config.model)
    if hasattr(model, "on_platform"):
        model = model.on_platform(devices[0].platform)
    run = setup.build(config, mesh, model=model)  # the config's sharding rules, on that mesh
    abstract, state_sh = run.abstract_state, run.state_shardings
    start, compiled, oom = time.perf_counter(), None, None
    with jax.set_mesh(mesh), _uncached(devices[0].platform != jax.default_backend()):
        lowered = run.train_step.lower(run.state_target(), run.batch_target())
        try:
            compiled = lowered.compile()
        except Exception as e:  # noqa: BLE001 - only an out-of-memory compile is a result
            if not _out_of_memory(e):
                raise
            oom = str(e).strip().splitlines()[0][:500]
    state_bytes = sum(
        math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize
        for a, s in zip(jax.tree.leaves(abstract), jax.tree.leaves(state_sh), strict=True)
    )
    return {
        "compiled": compiled,
        "oom": oom,
        "mesh": mesh,
        "model": run.model,
        "kernels": setup.resolved_kernels(run.model),
        "abstract": abstract,
        "state_bytes_per_device": state_bytes,
        "compile_seconds": time.perf_counter() - start,
    }


def memory_report(result, memory_bytes: int | None = None) -> dict:
    """Per-device bytes from XLA's memory analysis (and the loop-body collective check)."""
    from gpn_jax.parallel import hlo

    compiled = result["compiled"]
    if compiled is None:
        return {"total": None, "fits": False, "oom": result["oom"], "loop_collectives": {}}
    m = compiled.memory_analysis()
    report = {
        "arguments": m.argument_size_in_bytes,
        "outputs": m.output_size_in_bytes,
        "aliased": m.alias_size_in_bytes,
        "temporaries": m.temp_size_in_bytes,
        "code": m.generated_code_size_in_bytes,
    }
    report["total"] = (
        report["arguments"] + report["outputs"] - report["aliased"] + report["temporaries"]
    )
    report["state"] = result["state_bytes_per_device"]
    loops = hlo.while_loops(compiled.as_text())
    report["loop_collectives"] = {
        f"{lp.body} ({lp.trip_count} iterations)": dict(lp.collectives)
        for lp in loops
        if lp.collectives
    }
    if memory_bytes:
        report["fits"] = report["total"] <= memory_bytes
    return report
