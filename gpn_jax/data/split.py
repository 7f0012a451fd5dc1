"""Deterministic train / held-out splits that never share text or tokens."""


def _check_fraction(heldout_fraction: float) -> None:
    if not 0.0 <= heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in [0, 1), got {heldout_fraction}")


def split_documents(docs: list[str], heldout_fraction: float) -> tuple[list[str], list[str]]:
    """Splits off the last `heldout_fraction` of the corpus characters as held-out text.

    The cut falls after the first newline at or past the exact point inside the document it
    hits (so one huge document splits too). Train + held-out text is the original text.
    """
    _check_fraction(heldout_fraction)
    total = sum(len(d) for d in docs)
    cut = total - int(round(total * heldout_fraction))
    if cut >= total:
        return list(docs), []
    seen = 0
    for i, doc in enumerate(docs):
        if seen + len(doc) > cut:
            at = _snap_to_line(doc, cut - seen)
            head, tail = doc[:at], doc[at:]
            return docs[:i] + ([head] if head else []), ([tail] if tail else []) + docs[i + 1 :]
        seen += len(doc)
    return list(docs), []


def _snap_to_line(doc: str, at: int) -> int:
    if at == 0:
        return 0
    newline = doc.find("\n", at - 1)
    return newline + 1 if 0 <= newline < len(doc) - 1 else at


def split_tokens(num_tokens: int, heldout_fraction: float) -> int:
    """Index where held-out tokens start: the last `heldout_fraction` of `num_tokens`."""
    _check_fraction(heldout_fraction)
    return num_tokens - int(round(num_tokens * heldout_fraction))
