"""Resolves, installing nothing, what launch/setup_host.sh installs on a host, and checks the
accelerator's JAX in it. `launch/setup_host.sh EXTRA --resolve[=REPORT.json]` runs it in a
throwaway venv on the host's Python (`launch/tpu_vm.sh resolve`: a TPU worker's install), from
the repository root:

    python launch/resolve_install.py EXTRA REPORT.json|'' PIP_INSTALL_ARGS...

pip's resolver (`pip install --dry-run --ignore-installed --report`) resolves PIP_INSTALL_ARGS
for this interpreter and platform. It evaluates environment markers (setup.cfg's
`python_version` ones among them) for the running interpreter whatever `--python-version` says,
so the interpreter must be the host's. Every `==` pin of setup.cfg's EXTRA that applies here
(jax[tpu] and libtpu; jax[cuda12] and its plugin) must come out at its version, and jaxlib at
jax's. Exit 0 and one line naming them; 1 and one line per pin missed (or pip's own error);
3 and one line when the package index cannot be reached.
"""

import configparser
import json
import os
import re
import subprocess
import sys
import tempfile

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # the throwaway venv of `setup_host.sh --resolve` has pip's copy only
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROG = "resolve_install"
UNREACHABLE = 3
# pip's log line when an index page cannot be fetched for want of a connection
NO_CONNECTION = re.compile(r"Could not fetch URL (\S+): (?:connection error|timed out)")


def pins(setup_cfg: str, extra: str, environment: dict) -> list:
    """The `==` requirements of setup.cfg's extra whose markers hold in `environment`."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(setup_cfg)
    lines = parser["options.extras_require"][extra].splitlines()
    reqs = [Requirement(line) for line in lines if line.strip()]
    return [
        r
        for r in reqs
        if (r.marker is None or r.marker.evaluate(environment))
        and any(s.operator == "==" for s in r.specifier)
    ]


def resolved(report: dict) -> dict:
    """{canonical name: version} of what pip's report would install."""
    return {
        canonicalize_name(p["metadata"]["name"]): p["metadata"]["version"]
        for p in report["install"]
    }


def problems(report: dict, wanted: list) -> list[str]:
    """One line per pin the resolution misses; jaxlib must match jax."""
    got = resolved(report)
    out = []
    for r in wanted:
        version = got.get(canonicalize_name(r.name))
        if version is None or not r.specifier.contains(version, prereleases=True):
            out.append(f"{r.name} resolved to {version}, setup.cfg pins {r}")
    if got.get("jaxlib") != got.get("jax"):
        out.append(f"jaxlib resolved to {got.get('jaxlib')}, jax to {got.get('jax')}")
    return out


def summary(report: dict, wanted: list) -> str:
    got = resolved(report)
    env = report["environment"]
    names = [canonicalize_name(r.name) for r in wanted] + ["jaxlib"]
    versions = ", ".join(f"{n} {got[n]}" for n in dict.fromkeys(sorted(names)))
    return (
        f"resolved for Python {env['python_full_version']} ({env['sys_platform']} "
        f"{env['platform_machine']}): {versions}, at setup.cfg's pins; "
        f"{len(got)} packages, nothing installed"
    )


def pip_resolve(args: list[str], report: str, log: str) -> int:
    """pip's resolution of `pip install ARGS`, written to `report`; its own messages pass."""
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    cmd += ["--report", report, "--log", log, *args]
    return subprocess.run(cmd, cwd=ROOT).returncode


def unreachable_index(log: str) -> str | None:
    """The index URL pip could not connect to, if any: in the resolution's log, or else in a
    look-up of setuptools (the build requirement it fetches first, in a subprocess that logs
    no connection errors)."""
    probe = os.path.join(os.path.dirname(log), "probe.log")
    cmd = [sys.executable, "-m", "pip", "index", "versions", "setuptools", "--log", probe]
    subprocess.run(cmd, capture_output=True)
    for path in (log, probe):
        with open(path, encoding="utf-8", errors="replace") as f:
            found = NO_CONNECTION.search(f.read())
        if found:
            return found[1]
    return None


def resolve(args: list[str], report_path: str) -> dict | int:
    """pip's report, or the exit status after one line saying why there is none."""
    with tempfile.TemporaryDirectory() as tmp:
        report_path = report_path or os.path.join(tmp, "report.json")
        log = os.path.join(tmp, "pip.log")
        if pip_resolve(args, report_path, log) == 0:
            with open(report_path, encoding="utf-8") as f:
                return json.load(f)
        url = unreachable_index(log)
    if url:
        print(f"{PROG}: error: cannot reach the package index ({url}); "
              "run it where pip can download", file=sys.stderr)  # fmt: skip
        return UNREACHABLE
    print(f"{PROG}: error: pip cannot resolve {' '.join(args)} for this Python "
          "(its message above)", file=sys.stderr)  # fmt: skip
    return 1


def check(extra: str, report_path: str, args: list[str]) -> int:
    report = resolve(args, report_path)
    if isinstance(report, int):
        return report
    with open(os.path.join(ROOT, "setup.cfg"), encoding="utf-8") as f:
        wanted = pins(f.read(), extra, report["environment"])
    bad = problems(report, wanted)
    for line in bad:
        print(f"{PROG}: error: {line}", file=sys.stderr)
    if not bad:
        print(summary(report, wanted))
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    sys.exit(check(sys.argv[1], sys.argv[2], sys.argv[3:]))
