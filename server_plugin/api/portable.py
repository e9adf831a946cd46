"""GET /v1/export and POST /v1/import: the whole store as one document, and back (portable.py)."""

from __future__ import annotations

from flask import Blueprint, Response

from ..retrieval import docs, reembed
from ..store import portable
from .common import body, svc

bp = Blueprint("portable", __name__)


@bp.get("/export")
def export() -> Response:
    stamp = svc().clock.iso()[:19].replace(":", "").replace("-", "")
    # Streamed: a campaign's document is hundreds of MB, never held whole.
    return Response(portable.export_chunks(svc().db), mimetype="application/json", headers={
        "Content-Disposition": f'attachment; filename="chronicler-export-{stamp}.json"'})


@bp.post("/import")
def import_() -> dict:
    data = body("import.request")
    result = portable.import_into(svc(), data["document"], data.get("mode", "empty"),
                                  data.get("confirm_replace", False), finish=docs.analyse_pending)
    reembed.follow_store(svc())  # the document's vectors may be another model's
    return result
