"""Run names (importable with nothing but the standard library): a name is a folder name."""
IDENTIFIER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
