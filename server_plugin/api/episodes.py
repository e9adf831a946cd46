"""Character memories and scene summaries (SW4, SW5): list, fetch, delete; told events (SW9b)."""

from __future__ import annotations

from flask import Blueprint

from ..story import episodes, told
from .common import path_id, query, svc

bp = Blueprint("episodes", __name__)


@bp.get("/episodes")
def list_episodes() -> dict:
    return {"episodes": episodes.list_episodes(svc(), **query("episodes_list.query"))}


@bp.get("/episodes/<episode_id>")
def get_episode(episode_id: str) -> dict:
    return {"episode": episodes.get(svc(), path_id(episode_id, "episode id"))}


@bp.delete("/episodes/<episode_id>")
def delete_episode(episode_id: str) -> dict:
    return episodes.delete(svc(), path_id(episode_id, "episode id"))


@bp.get("/told")
def list_told() -> dict:
    return {"told": told.list_told(svc(), **query("told_list.query"))}
