"""Lore entries and story cards (SW7): create, list, get, edit, delete, and World Info import;
the proposals of lore grown from play: list, edit, accept, reject. An entry shows the messages
it rests on (`sources`, [] for entries not grown from play)."""

from __future__ import annotations

from flask import Blueprint

from ..sillytavern import cards
from ..story import lore, lore_growth
from .common import body, path_id, query, svc

bp = Blueprint("lore", __name__)


def _with_sources(entries: list[dict]) -> list[dict]:
    found = lore_growth.sources_of(svc(), [e["id"] for e in entries])
    return [{**e, "sources": found.get(e["id"], [])} for e in entries]


@bp.post("/lore")
def create_lore() -> tuple[dict, int]:
    return {"entry": _with_sources([lore.create(svc(), body("lore_create.request"))])[0]}, 201


@bp.get("/lore")
def list_lore() -> dict:
    return {"lore": _with_sources(lore.list_lore(svc(), **query("lore_list.query")))}


@bp.post("/lore/import")
def import_lore() -> tuple[dict, int]:
    data = body("lore_import.request")
    result = cards.import_world_info(svc(), data)
    return result, 200 if data.get("dry_run") else 201


@bp.get("/lore/stats")
def lore_stats() -> dict:
    args = query("lore_stats.query")
    return {"stats": lore.stats_list(svc(), args["chat_id"])}


@bp.get("/lore/proposals")
def list_proposals() -> dict:
    args = query("lore_proposals.query")
    state = args.get("state", "pending")
    return {"proposals": lore_growth.list_proposals(svc(), chat_id=args.get("chat_id"),
                                                    state=None if state == "all" else state)}


@bp.patch("/lore/proposals/<proposal_id>")
def edit_proposal(proposal_id: str) -> dict:
    return {"proposal": lore_growth.edit(svc(), path_id(proposal_id, "proposal id"),
                                         body("lore_proposal_patch.request"))}


@bp.post("/lore/proposals/<proposal_id>/accept")
def accept_proposal(proposal_id: str) -> dict:
    out = lore_growth.accept(svc(), path_id(proposal_id, "proposal id"), body("lore_proposal_accept.request"))
    return {"proposal": out["proposal"], "entry": _with_sources([out["entry"]])[0]}


@bp.post("/lore/proposals/<proposal_id>/reject")
def reject_proposal(proposal_id: str) -> dict:
    body("empty.request")
    return {"proposal": lore_growth.reject(svc(), path_id(proposal_id, "proposal id"))}


@bp.get("/lore/<lore_id>")
def get_lore(lore_id: str) -> dict:
    return {"entry": _with_sources([lore.get(svc(), path_id(lore_id, "lore id"))])[0]}


@bp.patch("/lore/<lore_id>")
def update_lore(lore_id: str) -> dict:
    return {"entry": _with_sources([lore.update(svc(), path_id(lore_id, "lore id"), body("lore_patch.request"))])[0]}


@bp.delete("/lore/<lore_id>")
def delete_lore(lore_id: str) -> dict:
    return lore_growth.delete_entry(svc(), path_id(lore_id, "lore id"))
