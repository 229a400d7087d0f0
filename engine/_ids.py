"""Identifier rules: workflow ids, activity ids and registered names."""

from __future__ import annotations

import re

from ._errors import BadInput

ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*\Z")
MAX_ID_LEN = 200


def check_id(value: object, *, what: str = "workflow id") -> str:
    """Return ``value`` if it is a valid id (``[A-Za-z0-9][A-Za-z0-9._/-]*``), else raise ``BadInput``."""
    if not isinstance(value, str) or not ID_RE.match(value) or len(value) > MAX_ID_LEN or ".." in value:
        raise BadInput(
            f"malformed {what} {value!r}: use letters, digits and . _ / - "
            f"(starting with a letter or digit, no '..', at most {MAX_ID_LEN} characters)"
        )
    return value
