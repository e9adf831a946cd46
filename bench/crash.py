"""Long crash run: SIGKILL the sidecar many times while clients write, then count what was lost.

The same harness as tests/test_crash.py (tests/helpers/crash.py), with more kills and workers.
Prints the kills, the acknowledged writes by operation, the writes cut in flight (and how many of
them turned out applied), every problem found (the goal: none) and the time taken.

    .venv/bin/python bench/crash.py [--kills 100] [--workers 4] [--seed N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.crash import run_crash_cycles  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description="SIGKILL the sidecar again and again; count losses.")
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--loading-share", type=float, default=0.5,
                        help="share of kills while the embedding model is still loading")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chronicler-crash-") as folder:
        report = run_crash_cycles(Path(folder), kills=args.kills, workers=args.workers, seed=args.seed,
                                  loading_share=args.loading_share,
                                  log=(lambda _: None) if args.quiet else print)
    acked = sum(report.acked.values())
    print(f"kills: {report.kills} ({report.kills_while_loading} while the model loaded)")
    print(f"acknowledged writes: {acked} {dict(sorted(report.acked.items()))}")
    print(f"writes cut in flight: {report.in_flight} ({report.in_flight_applied} found applied, "
          f"{report.in_flight - report.in_flight_applied} not applied; all whole or nothing)")
    print(f"restart to /v1/health: median {sorted(report.restart_seconds)[len(report.restart_seconds) // 2]:.2f} s")
    print(f"problems (lost, half-written, corrupt): {len(report.problems)}")
    for problem in report.problems[:50]:
        print("  " + problem)
    print(f"background jobs at the end: {dict(report.jobs)}")
    print(f"5xx / locked answers: {len(report.failures)}")
    for failure in report.failures[:20]:
        print("  " + failure)
    print(f"time: {report.seconds:.1f} s")
    return 1 if report.problems or report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
