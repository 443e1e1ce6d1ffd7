"""The extension's TypeScript interfaces read as field -> (optional, type), and compared with a JSON schema.

The kernel writes the saved bundle (``ranks_bundle.schema.json``) and the workers comm's messages
(``workers_protocol.schema.json``); ``extension/src/bundle.ts`` and ``extension/src/workers/protocol.ts``
declare the same shapes by hand. ``differences`` lists where one side has a field the other
lacks, calls a field optional the other requires, or gives it another type. Types compare as
sets of atoms: ``string``, ``number`` (JSON's integer and number), ``boolean``, ``null``,
``object``, a literal (``'done'``), ``array<atom>`` and ``ref:IName`` (an interface, or the
schema definition it maps to). A TypeScript ``string`` or ``number`` reads every literal of its
kind; a schema array without ``items`` takes any array.

Example::

    problems = differences(interfaces(Path("extension/src/bundle.ts").read_text()), BUNDLE, schema)
    assert problems == []
"""

from __future__ import annotations

import copy
import re
from typing import Any

# interface -> the schema definition it mirrors ("" is the schema's root)
BUNDLE = {"IRanksBundle": "", "IRankEntry": "rank", "IRankStatus": "status", "IOutput": "output"}
PROTOCOL = {"IStatusMessage": "status_message", "IErrorMessage": "error_message", "IWorkersStatus": "workers", "IRankInfo": "rank"}
TS_OBJECTS = {"PartialJSONObject", "PartialJSONValue", "JSONObject"}  # lumino's JSON object types

_INTERFACE = re.compile(r"export interface (I\w+) \{(.*?)\n\}", re.S)
_FIELD = re.compile(r"^\s*(\w+)(\?)?:\s*(.+?);\s*$", re.M)
_ALIAS = re.compile(r"export type (\w+) = (.+?);", re.S)
_COMMENTS = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def interfaces(source: str) -> dict[str, dict[str, tuple[bool, frozenset[str]]]]:
    """Every ``export interface`` of a TypeScript source: name -> field -> (optional, type atoms)."""
    text = _COMMENTS.sub("", source)
    found = {}
    for name, body in _INTERFACE.findall(text):
        found[name] = {field: (bool(optional), ts_atoms(kind)) for field, optional, kind in _FIELD.findall(body)}
    return found


def aliases(source: str) -> dict[str, frozenset[str]]:
    """Every ``export type X = ...`` union: name -> type atoms."""
    return {name: ts_atoms(kind) for name, kind in _ALIAS.findall(_COMMENTS.sub("", source))}


def ts_atoms(kind: str) -> frozenset[str]:
    atoms = set()
    for part in (p.strip() for p in kind.split("|")):
        if part.endswith("[]"):
            atoms.add(f"array<{_ts_atom(part[:-2].strip('() '))}>")
        else:
            atoms.add(_ts_atom(part))
    return frozenset(atoms)


def _ts_atom(part: str) -> str:
    if part in ("string", "number", "boolean", "null"):
        return part
    if part in TS_OBJECTS or part.startswith("Record<"):
        return "object"
    if part[:1] in "'\"":
        return f"'{part[1:-1]}'"
    return f"ref:{part}"


def schema_atoms(node: dict[str, Any], names: dict[str, str]) -> frozenset[str]:
    """A schema node's type atoms; ``names``: definition -> the interface that mirrors it."""
    if "$ref" in node:
        return frozenset({f"ref:{names[node['$ref'].rsplit('/', 1)[-1]]}"})
    if "oneOf" in node and "type" not in node:
        return frozenset().union(*(schema_atoms(option, names) for option in node["oneOf"]))
    if "const" in node:
        return frozenset({_literal(node["const"])})
    if "enum" in node:
        return frozenset(_literal(value) for value in node["enum"])
    kinds = node.get("type", [])
    atoms = set()
    for kind in [kinds] if isinstance(kinds, str) else kinds:
        if kind == "array":
            items = node.get("items")
            atoms.update(f"array<{atom}>" for atom in schema_atoms(items, names)) if items else atoms.add("array<*>")
        else:
            atoms.add({"integer": "number"}.get(kind, kind))
    return frozenset(atoms)


def _literal(value: Any) -> str:
    return f"'{value}'" if isinstance(value, str) else "boolean" if isinstance(value, bool) else "number"


def schema_fields(schema: dict[str, Any], definition: str, names: dict[str, str]) -> dict[str, tuple[bool, frozenset[str]]]:
    """A definition's fields: field -> (optional, type atoms); the variants of a ``oneOf`` of objects merged."""
    node = schema if definition == "" else schema["$defs"][definition]
    variants = node.get("oneOf", []) if "properties" not in node else [node]
    required = set(node.get("required", []))
    fields: dict[str, set[str]] = {}
    for variant in variants:
        for field, spec in variant.get("properties", {}).items():
            fields.setdefault(field, set()).update(schema_atoms(spec, names))
    return {field: (field not in required, frozenset(atoms)) for field, atoms in fields.items()}


def _covers(reader: str, written: str) -> bool:
    """Whether a TypeScript atom reads what a schema atom allows."""
    if reader == written or (reader == "string" and written.startswith("'")):
        return True
    return reader.startswith("array<") and written == "array<*>"


def type_differs(ts: frozenset[str], schema: frozenset[str]) -> bool:
    unread = [atom for atom in schema if not any(_covers(reader, atom) for reader in ts)]
    unwritten = [atom for atom in ts if not any(_covers(atom, written) for written in schema)]
    return bool(unread or unwritten)


def differences(declared: dict[str, dict[str, tuple[bool, frozenset[str]]]], mapping: dict[str, str], schema: dict[str, Any]) -> list[str]:
    """Where the interfaces of ``mapping`` and the schema's definitions disagree, in words."""
    names = {definition: interface for interface, definition in mapping.items()}
    problems = []
    for interface, definition in mapping.items():
        where = f"{interface} / {definition or 'the root'}"
        if interface not in declared:
            problems.append(f"{where}: no interface {interface} in the TypeScript source")
            continue
        ts, written = declared[interface], schema_fields(schema, definition, names)
        for field in sorted(set(ts) | set(written)):
            if field not in ts:
                problems.append(f"{where}: {field!r} is in the schema, not in the TypeScript")
            elif field not in written:
                problems.append(f"{where}: {field!r} is in the TypeScript, not in the schema")
            elif ts[field][0] != written[field][0]:
                problems.append(f"{where}: {field!r} is {'optional' if ts[field][0] else 'required'} in the TypeScript, not in the schema")
            elif type_differs(ts[field][1], written[field][1]):
                problems.append(f"{where}: {field!r} is {sorted(ts[field][1])} in the TypeScript, {sorted(written[field][1])} in the schema")
    return problems


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with no field beyond those it names, for objects that name theirs: what the
    kernel writes must be in the schema (readers accept more, for bundles of a newer 1.x)."""
    tight = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(tight)
    return tight
