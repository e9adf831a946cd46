// The sync's front door: what the rest of the extension (and its tests) use of src/sync/.
//   records.js  SillyTavern messages -> our records (ids, turns, speakers), pure
//   ledger.js   what was seen and sent of a chat, what vanished, orphans
//   cast.js     who is in a chat; the sidecar's characters (creation, rename, delete)
//   queue.js    the one serial queue, its gate and its critical tasks
//   chat.js     ChatSync: the I/O that keeps the sidecar's copy of each chat in step
//   saved.js    the open chat as SillyTavern saved it (the last save wins: two tabs on one chat)

export {
    ID_KEY, TURN_KEY, branchLink, chatRecords, ensureIds, idMaker, messageId, messageTurn, personaOf, speakerOf, stampTurn,
    swipePending, toIso, toRecord,
} from './records.js';
export { ChatLedger, fingerprint, idsFromListing, listAllIds, orphanIds, reconcile } from './ledger.js';
export {
    CastSync, characterAvatar, characterCopy, characterFromCard, chatMembers, chatTitle, memoryMoves, moveCharacter,
    placeNow, speakerNow,
} from './cast.js';
export { SyncQueue } from './queue.js';
export { ChatSync, batches } from './chat.js';
export { savedMessages } from './saved.js';
