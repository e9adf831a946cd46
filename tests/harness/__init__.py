"""Harnesses for the fault, load and attack tests (issue 8: "Nothing lost, no one in").

- `process`: the sidecar as a real process that can be SIGKILLed and restarted on the same port.
- `client`: a small HTTP client that never raises on an HTTP status (only on a dead connection).
- `ledger`: what the store must hold, built only from acknowledged writes, and the checks.
- `workload`: the writes, grouped by route family; a new family is one class added to FAMILIES.

Used by tests/test_crash.py, tests/test_concurrency.py, tests/test_backup.py and bench/*.py.
"""
