"""A small JSON Schema validator for the keywords our generated schemas use (no jsonschema package
is installed): type, properties, required, additionalProperties, items, $ref, anyOf, enum, const,
pattern, minimum/maximum (exclusive too), minLength/maxLength, minItems."""

from __future__ import annotations

import re

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def errors(instance, schema: dict, root: dict | None = None, path: str = "$") -> list[str]:
    root = root or schema
    out: list[str] = []
    if "$ref" in schema:
        name = schema["$ref"].split("/")[-1]
        return errors(instance, root["$defs"][name], root, path)
    if "anyOf" in schema and not any(not errors(instance, s, root, path) for s in schema["anyOf"]):
        out.append(f"{path}: matches none of anyOf")
    t = schema.get("type")
    if t is not None:
        ok = (
            (isinstance(instance, int) and not isinstance(instance, bool))
            if t == "integer"
            else (isinstance(instance, (int, float)) and not isinstance(instance, bool))
            if t == "number"
            else isinstance(instance, _TYPES[t])
        )
        if not ok:
            return [f"{path}: expected {t}, got {type(instance).__name__}"]
    if "enum" in schema and instance not in schema["enum"]:
        out.append(f"{path}: {instance!r} not in {schema['enum']}")
    if "const" in schema and instance != schema["const"]:
        out.append(f"{path}: {instance!r} != {schema['const']!r}")
    if isinstance(instance, str):
        if "pattern" in schema and not re.search(schema["pattern"], instance):
            out.append(f"{path}: {instance!r} does not match {schema['pattern']}")
        if len(instance) < schema.get("minLength", 0) or len(instance) > schema.get("maxLength", 10**9):
            out.append(f"{path}: bad length")
    if isinstance(instance, (int, float)) and not isinstance(instance, bool):
        if (
            ("minimum" in schema and instance < schema["minimum"])
            or ("maximum" in schema and instance > schema["maximum"])
            or ("exclusiveMinimum" in schema and instance <= schema["exclusiveMinimum"])
            or ("exclusiveMaximum" in schema and instance >= schema["exclusiveMaximum"])
        ):
            out.append(f"{path}: {instance} out of range")
    if isinstance(instance, list):
        if len(instance) < schema.get("minItems", 0):
            out.append(f"{path}: fewer than {schema['minItems']} items")
        if "items" in schema:
            for i, item in enumerate(instance):
                out += errors(item, schema["items"], root, f"{path}[{i}]")
    if isinstance(instance, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in instance:
                out.append(f"{path}: missing {key}")
        for key, value in instance.items():
            if key in props:
                out += errors(value, props[key], root, f"{path}.{key}")
            elif schema.get("additionalProperties") is False:
                out.append(f"{path}: unexpected {key}")
            elif isinstance(schema.get("additionalProperties"), dict):
                out += errors(value, schema["additionalProperties"], root, f"{path}.{key}")
    return out
