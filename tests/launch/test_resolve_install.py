"""The TPU VM's install, resolved before a VM is paid for (issue 84): `launch/tpu_vm.sh resolve`
runs `launch/setup_host.sh tpu --resolve`, where pip's resolver resolves the very packages
`install` installs on every worker, for this interpreter, and launch/resolve_install.py checks
jax, jaxlib and libtpu against setup.cfg's pins."""

import configparser
import importlib.util
import json
import os
import socket
import subprocess
import sys

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests import REPO_ROOT as ROOT

spec = importlib.util.spec_from_file_location(
    "resolve_install", os.path.join(ROOT, "launch", "resolve_install.py")
)
ri = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ri)
SETUP_CFG = open(os.path.join(ROOT, "setup.cfg"), encoding="utf-8").read()


def run(args, env=None, timeout=600):
    return subprocess.run(
        args, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        env=dict(os.environ, **(env or {})),
    )  # fmt: skip


def test_pins_are_the_extras_equal_pins_for_the_reports_python():
    def pins(extra, python):
        env = {"python_version": python, "python_full_version": f"{python}.0"}
        return {r.name: str(r.specifier) for r in ri.pins(SETUP_CFG, extra, env)}

    py311, py312 = pins("tpu", "3.11"), pins("tpu", "3.12")
    assert set(py311) == set(py312) == {"jax", "libtpu"}
    assert py311["jax"] != py312["jax"] and py311["libtpu"] != py312["libtpu"]
    assert all(s.startswith("==") for s in [*py311.values(), *py312.values()])
    assert set(pins("gpu", "3.11")) == {"jax", "jax-cuda12-plugin"}


def test_problems_name_each_missed_pin_and_a_jaxlib_apart_from_jax():
    wanted = [Requirement("jax[tpu]==0.10.2"), Requirement("libtpu==0.0.42.*")]

    def report(**versions):
        return {"install": [{"metadata": {"name": n, "version": v}} for n, v in versions.items()]}

    assert ri.problems(report(jax="0.10.2", jaxlib="0.10.2", libtpu="0.0.42.1"), wanted) == []
    got = ri.problems(report(jax="0.10.2", jaxlib="0.10.1", libtpu="0.0.43"), wanted)
    assert got == [
        "libtpu resolved to 0.0.43, setup.cfg pins libtpu==0.0.42.*",
        "jaxlib resolved to 0.10.1, jax to 0.10.2",
    ]
    assert ri.problems(report(jaxlib="0.10.2"), wanted)[0].startswith("jax resolved to None")


def test_tpu_vm_resolve_runs_setup_hosts_resolve_of_the_tpu_install():
    r = run(["bash", "launch/tpu_vm.sh", "--dry_run", "resolve"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"+ {ROOT}/launch/setup_host.sh tpu --resolve\n"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_index_is_one_line_and_status_3(tmp_path):
    """The only failure the resolution test skips on: pip could not connect to its index
    (here one on a closed port; pip's configuration files left out)."""
    env = {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PIP_RETRIES": "0",
           "PIP_INDEX_URL": f"http://127.0.0.1:{closed_port()}/simple"}  # fmt: skip
    r = run([sys.executable, "launch/resolve_install.py", "tpu", "", "-e", ".[tpu]"], env)
    assert r.returncode == ri.UNREACHABLE, r.stderr[-2000:]
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("resolve_install:")]
    assert line.startswith("resolve_install: error: cannot reach the package index (http://")


def test_a_requirement_no_index_offers_fails_and_is_not_taken_for_an_unreachable_one(tmp_path):
    env = {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path)}
    r = run([sys.executable, "launch/resolve_install.py", "tpu", "", "jax==0.10.2"], env)
    assert r.returncode == 1, r.stderr[-2000:]
    assert r.stderr.splitlines()[-1] == (
        "resolve_install: error: pip cannot resolve jax==0.10.2 for this Python (its message above)"
    )


@pytest.mark.slow
def test_the_tpu_vms_install_resolves_to_setup_cfgs_pins(tmp_path):
    """What `launch/tpu_vm.sh install` runs on every worker (`launch/setup_host.sh tpu`:
    `pip install -e ".[tpu]" gcsfs google-cloud-storage` in a fresh venv), resolved by pip for
    this interpreter (the TPU VM's Python where this runs on 3.11) without installing: jax,
    jaxlib and libtpu come out at setup.cfg's pins. Skipped only when pip cannot reach its
    package index."""
    report = tmp_path / "report.json"
    r = run(["bash", "launch/setup_host.sh", "tpu", f"--resolve={report}"],
            {"PYTHON": sys.executable})  # fmt: skip
    if r.returncode == ri.UNREACHABLE and "cannot reach the package index" in r.stderr:
        pytest.skip(r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    got = {canonicalize_name(p["metadata"]["name"]): p["metadata"]["version"]
           for p in json.loads(report.read_text())["install"]}  # fmt: skip
    parser = configparser.ConfigParser()
    parser.read_string(SETUP_CFG)
    pinned = [Requirement(x) for x in parser["options.extras_require"]["tpu"].split("\n") if x]
    pinned = {q.name: q.specifier for q in pinned if not q.marker or q.marker.evaluate()}
    assert set(pinned) == {"jax", "libtpu"}
    assert got["jax"] in pinned["jax"] and got["jaxlib"] == got["jax"]
    assert got["libtpu"] in pinned["libtpu"]
    assert {"gpn-jax", "gcsfs", "google-cloud-storage"} <= set(got)
    assert r.stdout.startswith(f"resolved for Python {sys.version.split()[0]} ")
