"""What this CPU offers, from /proc/cpuinfo (Linux; elsewhere nothing is known): read by the
kernels' builds and policy (`small_matmul`) and by the bench's header
(`gpn_jax.benchmarks.measure.cpu_vector_extensions`)."""

from pathlib import Path


def cpuinfo() -> str:
    """/proc/cpuinfo's text, or '' where there is none."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def flags(text: str) -> set[str] | None:
    """The words of the first `flags` (x86) / `Features` (Arm) line of a cpuinfo text; None
    without such a line."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return None
