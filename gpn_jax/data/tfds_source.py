"""Documents from a tensorflow-datasets dataset, read without TensorFlow.

Uses `tfds.data_source`'s reading path (`tfds.builder(...).as_data_source(split)`, random
access over array_record files, no TensorFlow: it is not installed here, and the tests build
and read a dataset offline) without its download step, so the dataset must already be
prepared in `data_dir` with `file_format='array_record'`; the steps are taken one by one so
each failure is a one-line error naming its fix.
"""

from collections.abc import Iterator

_READ_CHUNK = 1024
_HOW_TO_FIX = (
    "prepare it offline as array_record (e.g. `tfds build {name} --file_format=array_record "
    "--data_dir=DIR`) and pass data_dir=DIR, or check the name/config/split"
)


def open_tfds(name: str, split: str = "train", data_dir: str | None = None):
    """The random-access data source of `name`'s `split`. Raises a one-line ValueError.

    Records are array_record files of `tf.train.Example` protobufs (data only). A dataset
    tfds does not know by name is rebuilt from its JSON metadata, and for a custom feature
    type tfds imports the installed module that metadata names (never code from the data
    directory): read datasets you prepared.
    """
    import tensorflow_datasets as tfds

    where = f"tfds dataset {name!r} split {split!r} (data_dir={data_dir!r})"
    fix = _HOW_TO_FIX.format(name=name)
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except Exception as e:  # tfds raises many types (not found, bad config, ...).
        raise ValueError(f"{where} unavailable: {_first_line(e)} -- {fix}") from None
    if not builder.is_prepared():
        raise ValueError(f"{where} is not prepared in {builder.data_dir} -- {fix}")
    try:
        return builder.as_data_source(split=split)
    except Exception as e:  # wrong file format, unknown split, ...
        raise ValueError(f"{where} unreadable: {_first_line(e)} -- {fix}") from None


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def iter_tfds_documents(
    name: str,
    split: str = "train",
    data_dir: str | None = None,
    text_field: str | None = None,
    max_docs: int | None = None,
) -> Iterator[str]:
    """Yields the text of each example in index order (bytes decoded as UTF-8).

    `text_field` None means 'text' if present, else the only string feature.
    """
    source = open_tfds(name, split, data_dir)
    n = len(source) if max_docs is None else min(len(source), max_docs)
    for start in range(0, n, _READ_CHUNK):
        for example in _read(source, range(start, min(n, start + _READ_CHUNK))):
            text = _to_str(example_text(example, text_field, name))
            if text.strip():
                yield text


def _read(source, indices: range) -> list:
    getitems = getattr(source, "__getitems__", None)
    return list(getitems(list(indices))) if getitems else [source[i] for i in indices]


def example_text(example, text_field: str | None, name: str = "?"):
    """The text value of one example (dict of features or a bare value)."""
    if not isinstance(example, dict):
        return example
    if text_field is None:
        text_field = "text" if "text" in example else _only_string_field(example, name)
    if text_field not in example:
        raise ValueError(
            f"tfds dataset {name!r} has no field {text_field!r}; fields: {sorted(example)}"
        )
    return example[text_field]


def _only_string_field(example: dict, name: str) -> str:
    fields = [k for k, v in example.items() if isinstance(v, (bytes, str))]
    if len(fields) != 1:
        raise ValueError(
            f"tfds dataset {name!r}: cannot guess the text field among {sorted(example)}; "
            "pass text_field"
        )
    return fields[0]


def _to_str(value) -> str:
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, str):
        return value
    raise ValueError(f"tfds text feature has type {type(value).__name__}, expected bytes or str")
