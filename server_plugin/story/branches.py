"""Branches and checkpoints (rule CP2): a branch shares what its parent derived before its branch
point, without a job or a model call.

SillyTavern's "Create branch" (and a checkpoint) copies a chat's messages up to one message M into a
new chat file. When that chat is registered with `branch_of: {chat_id, message_id: M}` and holds
no messages yet (`hooks.chat_branched`, inside the registering write), the parent's messages up to
M are copied into it with their search entries and vectors (copied, never embedded again), and so
is every item derived only from them: the rolling summaries (RV3) covering only copied messages,
the sessions before M with their summaries (the one M falls in goes on open), the character
memories and scene summaries (SW4, SW5), and the memories jobs filed from them (CP1a). Nothing is
queued: an item straddling M is not copied, and the branch derives its own when its compaction or
its session end comes.

The extension then uploads the branch's messages as usual: a copied message sent unchanged
changes nothing; one whose text differs (a branch made from a swipe rewrites M under the same id)
is an edit of the branch's copy and re-derives only the branch's items. Copies are the branch's
own rows: editing, deleting or renaming the parent leaves them.

Told events (SW9b) whose evidence was copied are copied with what they granted, under the copy's
id: deleting the parent (which undoes its events) leaves what the branch's listeners were told.
Registered without a `message_id` (SillyTavern's branch metadata names the parent, not the message),
the branch point is found from the branch's first upload (CP2b, `conversation.ingest`): the last
message of the opening run that repeats the parent's messages, same id and same text.
"""

from __future__ import annotations

from ..hooks import Hooks
from ..jobs.queue import JobKinds
from ..services import Services
from ..store.db import Connection
from ..retrieval import visibility
from . import chats, episodes, memories, messages, sessions, summaries, told


def copy_from_parent(svc: Services, conn: Connection, branch_id: str, parent_id: str,
                     message_id: str | None) -> dict[str, int]:
    """Copy what the parent derived up to `message_id` into the empty branch (inside a write);
    returns how many of each kind were copied."""
    if message_id is None or messages.count(conn, branch_id):
        return {}
    upto = messages.fetch(conn, parent_id, message_id)
    if upto is None:
        return {}
    seqs, copied = messages.copy_prefix(conn, parent_id, branch_id, upto)
    done = {"messages": len(seqs)}
    done["summaries"] = len(summaries.copy_for_branch(conn, parent_id, branch_id, copied, seqs))
    done["sessions"] = sessions.copy_for_branch(conn, parent_id, branch_id, upto)
    scenes = episodes.copy_for_branch(conn, parent_id, branch_id, copied)
    filed = memories.copy_for_branch(svc, conn, parent_id, branch_id,
                                     chats.campaign_of(conn, branch_id) or branch_id, copied)
    done["episodes"], done["memories"] = len(scenes), len(filed)
    done["told_events"] = told.copy_for_branch(conn, parent_id, branch_id, copied,
                                               _copied_refs(seqs, scenes, filed))
    return done


def _copied_refs(seqs: dict[int, int], scenes: dict[str, str], filed: dict[str, str]) -> dict[tuple[str, str], str]:
    """(tellable item kind, parent ref) -> the branch copy's ref (visibility.ItemRef's kinds)."""
    refs = {(visibility.MESSAGE, str(a)): str(b) for a, b in seqs.items()}
    refs.update({(kind, a): b for a, b in scenes.items() for kind in (episodes.MEMORY, episodes.SCENE)})
    refs.update({(memories.KIND, a): b for a, b in filed.items()})
    return refs


def register(jobs: JobKinds, hooks: Hooks) -> None:
    """A chat registered as a branch gets its parent's items before the branch point (CP2)."""
    hooks.chat_branched.connect(copy_from_parent)
