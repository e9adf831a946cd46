"""GET /v1/export and POST /v1/import: the whole store as one document, and back (portable.py)."""

from __future__ import annotations

from flask import Blueprint, Response

from ..retrieval import docs, reembed
from ..store import portable
from .common import body, query, svc

bp = Blueprint("portable", __name__)


@bp.get("/export")
def export() -> Response:
    vectors = query("export.query").get("vectors", True)
    stamp = svc().clock.iso()[:19].replace(":", "").replace("-", "")
    name = f"chronicler-export-{stamp}{'' if vectors else '-no-vectors'}.json"
    # Streamed: a campaign's document is hundreds of MB, never held whole.
    return Response(portable.export_chunks(svc().db, vectors=vectors), mimetype="application/json",
                    headers={"Content-Disposition": f'attachment; filename="{name}"'})


@bp.post("/import")
def import_() -> dict:
    data = body("import.request")
    result = portable.import_into(svc(), data["document"], data.get("mode", "empty"),
                                  data.get("confirm_replace", False), finish=docs.analyse_pending,
                                  placeholders=reembed.without_vectors)
    # The document's vectors may be another model's, or placeholders: a move begins if so.
    reembed.follow_store(svc())
    return result
