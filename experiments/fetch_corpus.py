"""Fetches compare_small's English corpus from Debian's package archive and writes it as jsonl.

    python -m experiments.fetch_corpus --output=data/docs
    python -m gpn_jax.prepare --input=data/docs/docs.jsonl --output=data/docs_strat \
        --vocab_size=4096 --heldout_fraction=0.05 --heldout_stratified

The corpus is the reStructuredText sources that two Debian documentation packages ship in
their Sphinx trees (`usr/share/doc/<name>/html/_sources/**/*.rst.txt`): `python3.11-doc` (the
Python documentation: 497 files, ~11 MB of reference text, tutorials, HOWTOs and "What's new"
essays) and `linux-doc-6.1` (the Linux kernel's Documentation/: 3,184 files, 24 MB of driver,
subsystem and process guides), 35 MB of English technical prose with the reST markup left as
it is. A fresh machine that reaches Debian's archive gets them with
`apt-get download` (no root needed, no install). It is not the embedded corpus, which is
CPython's `pydoc_data` topics, a 0.5 MB extract of the Python half. Other registry text was
looked for and not kept: `apt-cache search gutenberg` lists no books, `debian-reference-en`
installs 3.8 MB in all, and the Python documentation alone (11 MB, `--packages=python3.11-doc`)
is read a third of an epoch by compare_small's budget, enough for the single-layer models to
score the training split 6-7 % better than held-out documents.

Documents are sections, not whole files: each file is cut at paragraph breaks (blank lines)
into consecutive pieces of at most `--piece_chars` characters (4,000 by default, about 1,000
tokens, FineWeb-Edu's typical document; a longer paragraph is a piece of its own;
`--piece_chars=0` keeps whole files). Why: the files average thousands of tokens (up to 62k),
and with whole files held out the held-out windows come from documents the model never saw a
window of, while a training window's neighbours were trained on: on the Python documentation
alone held-out PPL came out 24 % above train PPL (GPN+M, compare_small, seed 0, 0.36 epoch),
where the unigram model differs by 5 %; with pieces the same run gave +6.1 %.

Output: `<output>/docs.jsonl`, one `{"text", "path", "part"}` object per piece, doc folders
in sorted order and files in sorted path order within each (`path` is `<doc folder>/<file>`, e.g.
`python3.11/library/os.rst.txt`; the same .debs always give the same bytes; the parts of a file
joined give the file), and `<output>/source.json` (per package: version, .deb name and sha256;
files, documents, bytes). Bad input or a failed download prints one line and exits with
status 1.
"""

import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile

from absl import flags

from gpn_jax.io import cli

PACKAGES = ("python3.11-doc", "linux-doc-6.1")
CORPUS_FILE, SOURCE_FILE = "docs.jsonl", "source.json"
DOC_ROOT = "usr/share/doc"
SOURCES_GLOB = DOC_ROOT + "/*/html/_sources"
SUFFIX = ".rst.txt"
PIECE_CHARS = 4000


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ValueError(f"{name} not found: this command needs a Debian-based machine (apt/dpkg)")
    return path


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else "no message"


def download_deb(package: str, dest: str) -> str:
    """`apt-get download <package>` into `dest`; the .deb's path (one-line ValueError if not)."""
    proc = subprocess.run(
        [_tool("apt-get"), "download", package], cwd=dest, capture_output=True, text=True
    )
    debs = sorted(glob.glob(os.path.join(dest, "*.deb")))
    if proc.returncode != 0 or not debs:
        raise ValueError(
            f"apt-get download {package} failed ({_last_line(proc.stderr)}); "
            "run 'apt-get update' first if the package is unknown"
        )
    return debs[0]


def extract_deb(deb: str, dest: str) -> None:
    """Unpacks the .deb's files into `dest` (`dpkg-deb -x`, no install)."""
    proc = subprocess.run([_tool("dpkg-deb"), "-x", deb, dest], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ValueError(f"dpkg-deb -x {os.path.basename(deb)} failed: {_last_line(proc.stderr)}")


def sources_dirs(root: str) -> list[str]:
    """The `_sources` folders of an extracted documentation tree, in sorted order (at least one)."""
    # python3.X-doc also links its docs folder from another name: count real folders only
    found = sorted({os.path.realpath(p) for p in glob.glob(os.path.join(root, SOURCES_GLOB))})
    if not found:
        raise ValueError(f"no {SOURCES_GLOB} folder under {root}")
    return found


def documents(root: str) -> list[dict]:
    """Every non-empty `*.rst.txt` under the tree's `_sources` folders, sorted by path within each;
    `path` is `<doc folder>/<path under _sources>`."""
    docs = []
    for base in sources_dirs(root):
        folder = os.path.basename(os.path.dirname(os.path.dirname(base)))  # <folder>/html/_sources
        paths = sorted(glob.glob(os.path.join(base, "**", "*" + SUFFIX), recursive=True))
        for p in paths:
            with open(p, encoding="utf-8") as f:
                text = f.read()
            if text.strip():
                docs.append({"text": text, "path": f"{folder}/{os.path.relpath(p, base)}"})
    if not docs:
        raise ValueError(f"no {SUFFIX} documents under {root}")
    return docs


def pieces(text: str, max_chars: int) -> list[str]:
    """`text` cut after blank lines into consecutive pieces of at most `max_chars` characters (a
    longer paragraph is a piece of its own; 0: one piece). `"".join(pieces) == text`."""
    if max_chars <= 0:
        return [text]
    out, current = [], ""
    for para in re.split(r"(?<=\n\n)", text):  # each paragraph keeps its trailing blank line
        if current.strip() and len(current) + len(para) > max_chars:
            out.append(current)
            current = ""
        current += para
    if current.strip() or not out:
        out.append(current)
    else:
        out[-1] += current  # trailing whitespace stays with the last piece
    return out


def convert(root: str, output: str, source: dict | None = None, piece_chars: int = 0) -> dict:
    """Writes an extracted tree's documents, cut into `pieces`, to `<output>/docs.jsonl`
    (+ `source.json`)."""
    files = documents(root)
    docs = [
        {"text": piece, "path": f["path"], "part": i}
        for f in files
        for i, piece in enumerate(pieces(f["text"], piece_chars))
    ]
    os.makedirs(output, exist_ok=True)
    path = os.path.join(output, CORPUS_FILE)
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    info = dict(source or {}) | {
        "corpus": path,
        "files": len(files),
        "piece_chars": piece_chars,
        "documents": len(docs),
        "text_bytes": sum(len(d["text"].encode("utf-8")) for d in docs),
    }
    with open(os.path.join(output, SOURCE_FILE), "w") as f:
        json.dump(info, f, indent=2)
    return info


def _deb_info(deb: str, package: str) -> dict:
    version = subprocess.run(
        [_tool("dpkg-deb"), "-f", deb, "Version"], capture_output=True, text=True
    ).stdout.strip()
    with open(deb, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    return {"package": package, "version": version, "deb": os.path.basename(deb), "sha256": sha}


def fetch(output: str, packages=PACKAGES, piece_chars: int = PIECE_CHARS) -> dict:
    """Downloads and unpacks `packages` into one temporary tree, then `convert`s it to `output`."""
    if not packages:
        raise ValueError("--packages is empty: name at least one Debian documentation package")
    with tempfile.TemporaryDirectory(prefix="fetch_corpus-") as tmp:
        root, debs = os.path.join(tmp, "x"), []
        for package in packages:
            dest = os.path.join(tmp, f"deb{len(debs)}")
            os.makedirs(dest)
            deb = download_deb(package, dest)
            extract_deb(deb, root)
            debs.append(_deb_info(deb, package))
        return convert(root, output, {"packages": debs}, piece_chars)


_OUTPUT = flags.DEFINE_string("output", None, "Output folder for docs.jsonl and source.json.")
_PACKAGES = flags.DEFINE_list(
    "packages", list(PACKAGES), "Debian packages whose html/_sources trees form the corpus."
)
_PIECE = flags.DEFINE_integer(
    "piece_chars",
    PIECE_CHARS,
    "Cut files into documents of at most this many characters at "
    "paragraph breaks (0: whole files).",
)
flags.mark_flags_as_required(["output"])


def _body():
    info = fetch(_OUTPUT.value, _PACKAGES.value, _PIECE.value)
    names = ", ".join(f"{p['package']} {p['version']}" for p in info["packages"])
    print(
        f"Wrote {info['documents']} documents ({info['files']} files, "
        f"{info['text_bytes']:,} bytes) of {names} to {info['corpus']}"
    )
    return info


main, run = cli.absl_entry(_body, "fetch-corpus")


if __name__ == "__main__":
    run()
