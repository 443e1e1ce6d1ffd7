"""The extension's TypeScript shapes cannot drift from the JSON schemas the kernel writes against.

``extension/src/bundle.ts`` mirrors ``ranks_bundle.schema.json`` (the saved bundle) and
``extension/src/workers/protocol.ts`` mirrors ``workers_protocol.schema.json`` (the workers comm):
same fields, same optionality, same types (tests/extension_types.py). The kernel's side is held
to the same schemas by tests/output/test_bundle.py and tests/kernel/test_workers_comm_kernel.py,
which validate what it really writes with no field beyond the schema's.

Imports internals (notebook.workers_comm, output.widgets.bundle): the versions and the kernel's
status message it compares, below the public face.
"""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path

import jsonschema
import pytest

from nbaccel.notebook.workers_comm import PROTOCOL_VERSION, WorkersComm
from nbaccel.output.widgets.bundle import SCHEMA_VERSION
from tests.extension_types import BUNDLE, PROTOCOL, aliases, differences, interfaces, schema_atoms, strict

ROOT = Path(__file__).resolve().parent.parent
BUNDLE_TS = (ROOT / "extension/src/bundle.ts").read_text()
PROTOCOL_TS = (ROOT / "extension/src/workers/protocol.ts").read_text()
BUNDLE_SCHEMA = json.loads(resources.files("nbaccel.output.widgets").joinpath("ranks_bundle.schema.json").read_text())
PROTOCOL_SCHEMA = json.loads(resources.files("nbaccel.notebook").joinpath("workers_protocol.schema.json").read_text())


def test_bundle_ts_declares_the_bundle_schemas_fields_and_types() -> None:
    assert differences(interfaces(BUNDLE_TS), BUNDLE, BUNDLE_SCHEMA) == []
    assert f"export const SCHEMA_VERSION = {SCHEMA_VERSION};" in BUNDLE_TS and BUNDLE_SCHEMA["properties"]["version"] == {"const": SCHEMA_VERSION}


def test_protocol_ts_declares_the_workers_protocols_messages_and_requests() -> None:
    assert differences(interfaces(PROTOCOL_TS), PROTOCOL, PROTOCOL_SCHEMA) == []
    names = {definition: interface for interface, definition in PROTOCOL.items()}
    declared = aliases(PROTOCOL_TS)
    assert declared["KernelMessage"] == schema_atoms(PROTOCOL_SCHEMA, names)
    assert declared["Request"] == schema_atoms(PROTOCOL_SCHEMA["$defs"]["request"]["properties"]["request"], names)
    assert f"export const PROTOCOL_VERSION = {PROTOCOL_VERSION};" in PROTOCOL_TS


def test_a_field_added_on_one_side_only_or_changed_is_found() -> None:
    """The check fails where a field is added to the schema alone, to the TypeScript alone, or
    changes its type or optionality on one side."""
    schema = copy.deepcopy(BUNDLE_SCHEMA)
    schema["$defs"]["rank"]["properties"]["cpu_time"] = {"type": ["number", "null"]}
    assert differences(interfaces(BUNDLE_TS), BUNDLE, schema) == ["IRankEntry / rank: 'cpu_time' is in the schema, not in the TypeScript"]
    added = BUNDLE_TS.replace("  dropped_lines: number;\n", "  dropped_lines: number;\n  cpu_time?: number | null;\n")
    assert differences(interfaces(added), BUNDLE, BUNDLE_SCHEMA) == ["IRankEntry / rank: 'cpu_time' is in the TypeScript, not in the schema"]
    retyped = PROTOCOL_TS.replace("  num_processes: number;\n", "  num_processes: string;\n").replace("  cell: number | null;", "  cell?: number | null;")
    assert differences(interfaces(retyped), PROTOCOL, PROTOCOL_SCHEMA) == [
        "IWorkersStatus / workers: 'cell' is optional in the TypeScript, not in the schema",
        "IWorkersStatus / workers: 'num_processes' is ['string'] in the TypeScript, ['number'] in the schema",
    ]
    narrowed = BUNDLE_TS.replace("kind: 'waiting' | 'running' | 'done' | 'failed' | 'stopped';", "kind: 'waiting' | 'running' | 'done' | 'failed';")
    assert len(differences(interfaces(narrowed), BUNDLE, BUNDLE_SCHEMA)) == 1  # the kernel's 'stopped' would be unread


def test_the_kernels_status_message_has_only_the_schemas_fields() -> None:
    """With no workers (the kernel side of a real comm is in tests/kernel/test_workers_comm_kernel.py)."""
    message = WorkersComm(shell=None, workers=lambda: None).status_message()
    jsonschema.validate(message, strict(PROTOCOL_SCHEMA))
    jsonschema.validate({"request": "restart"}, PROTOCOL_SCHEMA["$defs"]["request"])
    with pytest.raises(jsonschema.ValidationError):  # a field the kernel added and the schema lacks
        jsonschema.validate({**message, "uptime": 3}, strict(PROTOCOL_SCHEMA))
