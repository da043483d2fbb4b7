"""Write tests/slow.txt, the tests the fast lane (`pytest -m "not slow"`) leaves out, from a full run's timings.

    python -m pytest -q --durations=0 > /tmp/durations.log
    python tests/slow_list.py /tmp/durations.log [--budget 75]

Keeps the quickest tests whose summed time (setup + call + teardown, as that run measured them) fits the budget in
seconds, and lists the rest (each with its seconds, for the reader). Times from a loaded machine overstate; the
budget is for an unloaded 2-vCPU machine (README: under 90 s)."""
from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(\S.*)$")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path, help="the output of a `python -m pytest --durations=0` run")
    ap.add_argument("--budget", type=float, default=75.0, help="seconds the fast lane may take (default 75)")
    ap.add_argument("--scale", type=float, default=1.0, help="divide the logged times by this (a loaded run)")
    args = ap.parse_args()
    times: dict[str, float] = defaultdict(float)
    for line in args.log.read_text().splitlines():
        if m := LINE.match(line):
            times[m[3].strip()] += float(m[1]) / args.scale
    if not times:
        raise SystemExit(f"{args.log}: no --durations=0 lines")
    spent, slow = 0.0, []
    for node, t in sorted(times.items(), key=lambda kv: kv[1]):
        if spent + t <= args.budget:
            spent += t
        else:
            slow.append((node, t))
    out = Path(__file__).with_name("slow.txt")
    out.write_text("# written by tests/slow_list.py: the tests `pytest -m \"not slow\"` leaves out (seconds measured)\n"
                   + "".join(f"{node}  # {t:.1f}\n" for node, t in sorted(slow)))
    print(f"{len(times) - len(slow)} fast tests, ~{spent:.0f} s; {len(slow)} slow, "
          f"~{sum(t for _, t in slow):.0f} s -> {out}")


if __name__ == "__main__":
    main()
