"""Run names (importable with nothing but the standard library): a name is a folder name."""
IDENTIFIER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class DuplicateKeyError(ValueError):
    """A JSON object names the same key twice (``json`` would silently keep the last value)."""


def refuse_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    """``object_pairs_hook`` for ``json.loads``: a dict, or ``DuplicateKeyError`` naming the key.
    Applies to every object, nested ones included."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(f"duplicate key {key!r}")
        out[key] = value
    return out
