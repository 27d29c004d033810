"""availability_report.py PROBE_JSON NAMES STARTS ENDS: the table of
bench/availability_probe.py's refusal windows per step. NAMES is
|-separated, STARTS and ENDS space-separated epoch seconds, one per step.
A window counts for every step it overlaps; a violation for the step it fell
in."""
import json
import sys

records = [json.loads(line) for line in open(sys.argv[1])]
counts = records.pop()
names = sys.argv[2].split("|")
starts = [float(x) for x in sys.argv[3].split()]
ends = [float(x) for x in sys.argv[4].split()]
windows = [r for r in records if "violation" not in r]
violations = [r for r in records if "violation" in r]


def overlaps(record, start, end):
    return record["start"] < end and (record["end"] or float("inf")) > start


print(f"| {'step':<12} | {'keys refused':>12} | {'worst refusal (s)':>17} | {'worst key':<10} "
      f"| {'why':<40} | {'held keys granted':>17} |")
print(f"|{'-' * 14}|{'-' * 14}|{'-' * 19}|{'-' * 12}|{'-' * 42}|{'-' * 19}|")
for name, start, end in zip(names, starts, ends):
    inside = [r for r in windows if overlaps(r, start, end)]
    worst = max(inside, key=lambda r: r["seconds"], default=None)
    granted = sum(1 for r in violations if start <= r["at"] < end)
    print(f"| {name:<12} | {len({r['key'] for r in inside}):>12} | "
          f"{(worst['seconds'] if worst else 0.0):>17.3f} | {(worst['key'] if worst else '-'):<10} "
          f"| {(','.join(worst['reasons']) if worst else '-'):<40} | {granted:>17} |"
          + (f" from +{worst['start'] - start:.3f} s" if worst else ""))
outside = [r for r in windows if not any(overlaps(r, s, e) for s, e in zip(starts, ends))]
print(f"tries {counts['tries']}, answered {counts['answered']}; refusals outside the steps: "
      f"{len(outside)}; held keys granted in all: {len(violations)}")

