"""What the stand-ins share: a "host" is a directory under $GPN_STANDIN_ROOT used as its home,
and a command "on" it is a local bash process there, with the environment a real host would
give it (its own HOME, no PYTHONPATH) plus JAX on CPU (GPN_STANDIN_DEVICES devices, default 1).
The tests give the stand-in hosts their compile settings: GPN_STANDIN_XLA_FLAGS (added to
XLA_FLAGS) and GPN_STANDIN_JAX_CACHE_DIR (JAX's persistent compilation cache); unset, a host
compiles with XLA's defaults and no cache, as a fresh machine would.

Stand-ins are for the rehearsal (launch/rehearse.sh) and the launch tests only: they run
every worker of a "pod" or "cluster" as a process on this machine.
"""

import contextlib
import os
import random
import shutil
import socket
import stat
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def root() -> str:
    r = os.environ.get("GPN_STANDIN_ROOT")
    if not r:
        sys.exit(f"{os.path.basename(sys.argv[0])} (stand-in): set GPN_STANDIN_ROOT")
    os.makedirs(r, exist_ok=True)
    return r


def host_home(*parts: str) -> str:
    """The home directory of a stand-in host, made on first use, with a Python virtual
    environment stand-in at ~/gpn_venv whose `pip install` is only recorded."""
    home = os.path.join(root(), *parts)
    venv_bin = os.path.join(home, "gpn_venv", "bin")
    os.makedirs(venv_bin, exist_ok=True)
    python = os.path.join(venv_bin, "python")
    if not os.path.exists(python):
        shutil.copy(os.path.join(HERE, "vm_python"), python)
        os.chmod(python, os.stat(python).st_mode | stat.S_IXUSR)
    return home


# What a fresh login on a host has: no PYTHONPATH, no virtualenv or run settings of the caller;
# the stand-ins' own settings and the job loop's knobs pass through (a host's configuration).
_PASS = ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR", "USER", "LOGNAME", "SHELL")
_PASS_PREFIX = (
    "GPN_STANDIN_", "GPN_RESTART_DELAY", "GPN_FINAL_GRACE", "GPN_MAX_FAILURES",
    "GPN_JAX_NATIVE_CACHE",
)  # fmt: skip


def host_env(home: str, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k in _PASS or k.startswith(_PASS_PREFIX)}
    devices = env.get("GPN_STANDIN_DEVICES", "1")
    env.update(
        HOME=home,
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=xla_flags(devices),
        GPN_STANDIN_PYTHON=env.get("GPN_STANDIN_PYTHON", sys.executable),
    )
    if os.environ.get("GPN_STANDIN_JAX_CACHE_DIR"):
        env["JAX_COMPILATION_CACHE_DIR"] = os.environ["GPN_STANDIN_JAX_CACHE_DIR"]
    env.update({k: str(v) for k, v in extra.items()})
    return env


def xla_flags(devices: str) -> str:
    """A stand-in host's XLA_FLAGS: its forced CPU devices and GPN_STANDIN_XLA_FLAGS."""
    extra = os.environ.get("GPN_STANDIN_XLA_FLAGS", "")
    return f"{extra} --xla_force_host_platform_device_count={devices}".strip()


def on_host(home: str, command: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen(["bash", "-c", command], cwd=home, env=env)


def free_port() -> int:
    """A free port below the kernel's ephemeral range (see tests/parallel/test_multihost.py)."""
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(10000, min(low, 32768))
        with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise SystemExit("stand-in: no free port")


def record(line: str) -> None:
    """Appends what a stand-in was asked to do to $GPN_STANDIN_ROOT/calls.log."""
    with open(os.path.join(root(), "calls.log"), "a") as f:
        f.write(line.rstrip("\n") + "\n")
