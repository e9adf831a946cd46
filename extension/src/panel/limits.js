// The panel's limits, named once. The sidecar's settings of the same meaning are authoritative
// (its answers say so: 409 quota_exceeded, 422 text_too_long); these mirror their defaults so the
// panel can count and warn before a request is sent.

export const PANEL_LIMITS = Object.freeze({
    memoryMaxChars: 500,        // memory_max_chars (RV8)
    pinnedPerScope: 20,         // pinned_per_scope (RV8)
    unpinnedPerScope: 100,      // unpinned_per_scope (RV8)
    maxSelected: 20,            // save_from_conversation_max_messages (RV9d)
    maxDrafts: 5,               // save_from_conversation_max_drafts (RV9d)
    descriptionMaxChars: 1000,  // description_max_chars (RV9c)
    draftsTimeoutMs: 90000,     // a drafts call waits on the model (sidecar: drafts_timeout_seconds)
    pageSize: 60,               // rows added to a list at a time (lists of hundreds stay fast)
    filterDebounceMs: 120,      // typing in a filter box waits this long before filtering
    jobsPollMs: 5000,           // the jobs status line refreshes this often while the panel is open
});
