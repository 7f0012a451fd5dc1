"""Turns a parsed text spec into its list of documents and a short description."""

from gpn_jax.data.spec import SourceSpec
from gpn_jax.data.text_sources import embedded_corpus, iter_path_documents
from gpn_jax.data.tfds_source import iter_tfds_documents


def load_documents(
    source: SourceSpec,
    *,
    data_dir: str | None = None,
    text_field: str | None = None,
    max_docs: int | None = None,
) -> tuple[list[str], str]:
    """(documents, description) of an 'embedded', 'text' or 'tfds' source.

    Raises ValueError if the source is missing or holds no non-blank document.
    """
    if source.kind == "embedded":
        docs, what = embedded_corpus(), "embedded corpus (pydoc_data.topics)"
    elif source.kind == "text":
        docs, what = list(iter_path_documents(source.path, text_field or "text")), source.path
    elif source.kind == "tfds":
        it = iter_tfds_documents(source.name, source.split, data_dir, text_field, max_docs)
        docs, what = list(it), f"tfds {source.name} split {source.split}"
    else:
        raise ValueError(f"source kind {source.kind!r} has no documents")
    docs = docs[:max_docs] if max_docs is not None else docs
    if not docs:
        raise ValueError(f"empty corpus: no non-blank documents in {what}")
    return docs, f"{what}: {len(docs):,} docs, {sum(map(len, docs)):,} chars"
