"""The JSON contract: every `--format json` output (and every file gpusync writes as JSON)
carries `schema_version` and `kind`, and is described by a JSON Schema file in this package,
`<kind without "gpusync-">.schema.json`. A change to an output's shape bumps its version here
and in its schema."""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

VERSIONS = {
    "gpusync-scan": 7,
    "gpusync-baseline": 6,
    "gpusync-gate": 1,
    "gpusync-bench": 1,
    "gpusync-bench-all": 1,
    "gpusync-overhead": 1,
    "gpusync-tune": 2,
    "gpusync-tune-profile": 1,
    "gpusync-fix": 1,
}
_SHARED = ("technique",)  # parts other schemas refer to by $id


def document(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """`body` stamped with its kind and that kind's schema_version, first."""
    return {"schema_version": VERSIONS[kind], "kind": kind, **body}


@lru_cache(maxsize=None)
def schema(kind: str) -> dict[str, Any]:
    return _load(kind.removeprefix("gpusync-"))


def _load(name: str) -> dict[str, Any]:
    return json.loads(resources.files(__name__).joinpath(f"{name}.schema.json").read_text())


@lru_cache(maxsize=None)
def _registry():
    from referencing import Registry, Resource

    docs = [schema(kind) for kind in VERSIONS] + [_load(name) for name in _SHARED]
    return Registry().with_resources(
        (doc["$id"], Resource.from_contents(doc)) for doc in docs)


def validator(kind: str):
    """A jsonschema validator of `kind`'s documents (shared parts resolved)."""
    import jsonschema

    return jsonschema.Draft202012Validator(schema(kind), registry=_registry())
