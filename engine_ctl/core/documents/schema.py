"""JSON Schema of the documents, generated from the models (for editors' YAML language servers)."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from engine_ctl.core.documents.apikey import ApiKeyDocument
from engine_ctl.core.documents.forms import DeploymentDocument, FlatDeploymentDocument, ModelDocument
from engine_ctl.core.documents.inventory import InventoryDocument

SCHEMA_ID = "https://engine-ctl.dev/schema/engine-ctl.schema.json"


def document_schema() -> dict[str, Any]:
    adapter: TypeAdapter[Any] = TypeAdapter(
        DeploymentDocument | FlatDeploymentDocument | ModelDocument | InventoryDocument | ApiKeyDocument
    )
    schema = adapter.json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = SCHEMA_ID
    schema["title"] = "engine-ctl document"
    schema["description"] = (
        "A deployment (metadata/spec form or flat name/engine/model form), a model (kind: Model) "
        "a host inventory (hosts:) or an API key (kind: ApiKey, its SHA-256 only)."
    )
    return schema
