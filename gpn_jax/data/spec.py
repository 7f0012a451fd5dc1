"""Parses data spec strings into `SourceSpec`s.

Grammar (first match wins)::

    embedded | "" | None                      the embedded pydoc corpus
    tfds:NAME[/CONFIG][:VERSION][:SPLIT]      a tensorflow-datasets dataset (SPLIT default
                                              'train'; tfds slicing such as 'train[:5%]' works)
    bin:PATH                                  pre-tokenised flat .bin shard file or directory
    recall:[NAME=INT,...]                     synthetic associative recall (`gpn_jax.data.recall`)
    text:PATH | PATH                          a .txt/.jsonl file or a directory of them
"""

import dataclasses
import os
import re

SPEC_GRAMMAR = (
    "'embedded', 'tfds:NAME[/CONFIG][:VERSION][:SPLIT]', 'bin:PATH', 'recall:[NAME=INT,...]', "
    "or a path (optionally 'text:PATH') to a .txt/.jsonl file or directory"
)
_PREFIX = re.compile(r"^([A-Za-z][\w+.-]*):(?!//)")
_VERSION = re.compile(r"^\d+\.\d+\.\d+$")


@dataclasses.dataclass(frozen=True)
class SourceSpec:
    """A parsed spec. `kind` is 'embedded', 'tfds', 'bin', 'recall' (params in `name`) or 'text'."""

    kind: str
    path: str = ""
    name: str = ""
    split: str = "train"


def parse_spec(spec: str | None) -> SourceSpec:
    """Parses `spec` (see the module docstring). Raises ValueError for unknown specs."""
    spec = (spec or "embedded").strip()
    if spec == "embedded":
        return SourceSpec("embedded")
    if spec.startswith("tfds:"):
        return _parse_tfds(spec[len("tfds:") :])
    if spec.startswith("bin:"):
        return SourceSpec("bin", path=_nonempty(spec[4:], spec))
    if spec.startswith("recall:"):
        return SourceSpec("recall", name=spec[len("recall:") :])
    if spec.startswith("text:"):
        return SourceSpec("text", path=_nonempty(spec[5:], spec))
    if _PREFIX.match(spec) and not os.path.exists(spec):
        raise ValueError(f"unknown data spec {spec!r}; expected {SPEC_GRAMMAR}")
    return SourceSpec("text", path=spec)


def _nonempty(path: str, spec: str) -> str:
    if not path:
        raise ValueError(f"data spec {spec!r} has no path; expected {SPEC_GRAMMAR}")
    return path


def _parse_tfds(rest: str) -> SourceSpec:
    name, _, tail = rest.partition(":")
    if not name:
        raise ValueError(f"data spec 'tfds:{rest}' has no dataset name; expected {SPEC_GRAMMAR}")
    head, sep, split = tail.partition(":")
    if _VERSION.match(head):
        name, tail = f"{name}:{head}", split if sep else ""
    return SourceSpec("tfds", name=name, split=tail or "train")
