#!/usr/bin/env bash
# Hunt flaky tests as a new user meets them: run the README's test command N times, each in a
# fresh clone of this checkout's HEAD with a fresh venv, while LOAD processes burn CPU, then
# print a tally of every test that ever failed (how often, and its first error line).
#
#   bash scripts/flake_hunt.sh N [LOAD] [PYTEST ARGS...]   # e.g. 5 2; or 5 2 -m slow
#
# PYTEST ARGS are appended to the README's command (`-m slow`: the slow tier).
# Environment: FLAKE_DIR (where clones and logs go; default a new temporary directory, kept
# for reading the logs), FLAKE_TIMEOUT (seconds per run; default 1800), RAYLESS_TEST_TIMEOUT_SCALE
# (passed through to the suite). Exit status: 0 when no test failed in any run, else 1.
set -euo pipefail

usage() { echo "usage: bash scripts/flake_hunt.sh N [LOAD] [PYTEST ARGS...]" >&2; exit 2; }
[ $# -ge 1 ] || usage
N=$1
LOAD=${2:-0}
shift $(( $# >= 2 ? 2 : 1 ))
EXTRA="$*"
[[ "$N" =~ ^[1-9][0-9]*$ ]] || usage
[[ "$LOAD" =~ ^[0-9]+$ ]] || usage

REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${FLAKE_DIR:-$(mktemp -d /tmp/rayless-flake-hunt-XXXXXX)}
mkdir -p "$OUT"
PER_RUN=${FLAKE_TIMEOUT:-1800}
# The README's second command, from "python3 -m venv" on (tests/unit/test_readme.py keeps
# README and .ci/run in step; this reads it from the README itself).
CMD=$(grep -m1 -- "pip install -e '.\[test\]'" "$REPO/README.md")
[ -n "$CMD" ] || { echo "no test command found in README.md" >&2; exit 2; }
[ -z "$EXTRA" ] || CMD="$CMD $EXTRA"

burners=()
stop_burners() {
  for pid in "${burners[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${burners[@]}"; do wait "$pid" 2>/dev/null || true; done
  burners=()
}
trap stop_burners EXIT INT TERM
for _ in $(seq 1 "$LOAD"); do
  python3 -c 'while 1: pass' &
  burners+=($!)
done

echo "flake hunt: $N run(s), $LOAD CPU burner(s), logs in $OUT"
echo "command: $CMD"
for i in $(seq 1 "$N"); do
  clone="$OUT/clone-$i"
  rm -rf "$clone"
  git clone -q --no-hardlinks "$REPO" "$clone"
  git -C "$clone" checkout -q "$(git -C "$REPO" rev-parse HEAD)"
  start=$(date +%s)
  set +e
  # the ini's -ra summary holds one "FAILED id - first line" / "ERROR id - ..." per failure
  (cd "$clone" && timeout "$PER_RUN" bash -c "$CMD") > "$OUT/run-$i.log" 2>&1
  rc=$?
  set -e
  echo "run $i: exit $rc in $(( $(date +%s) - start )) s: $(grep -E '(passed|failed|error).* in [0-9.]+s' "$OUT/run-$i.log" | tail -1)"
  if [ "$rc" = 124 ]; then
    echo "run-$i TIMEOUT (the-whole-run) - it ran past FLAKE_TIMEOUT=${PER_RUN} s" >> "$OUT/failures.txt"
  fi
  grep -E '^(FAILED|ERROR) ' "$OUT/run-$i.log" | sed "s/^/run-$i /" >> "$OUT/failures.txt" || true
  rm -rf "$clone/.venv"  # the venv is the big part; the clone stays for reading
done
stop_burners

echo
echo "tally (runs failed, test, first error line):"
if [ ! -s "$OUT/failures.txt" ]; then
  echo "  no test failed in $N run(s)"
  exit 0
fi
python3 - "$OUT" <<'EOF'
import collections, pathlib, re, sys

out = pathlib.Path(sys.argv[1])


def first_error(run: str, test: str) -> str:
    """The first "E   ..." line of the test's failure section in the run's log (the -ra
    summary leaves the message out when the line is long or under xdist)."""
    log = (out / f"{run}.log").read_text(encoding="utf-8", errors="replace").splitlines()
    name = test.rsplit("::", 1)[-1]
    header = re.compile(r"^_{3,} .*" + re.escape(name) + r".* _{3,}$")
    inside = False
    for line in log:
        if header.match(line):
            inside = True
        elif inside and line.startswith("E "):
            return line[1:].strip()
        elif inside and line.startswith("_____") and name not in line:
            break
    return "(no error line in the log)"


count, first = collections.Counter(), {}
for line in open(out / "failures.txt", encoding="utf-8", errors="replace"):
    run, kind, rest = line.rstrip("\n").split(" ", 2)
    test, _, message = rest.partition(" - ")
    key = f"{kind} {test}"
    count[key] += 1
    if key not in first:
        first[key] = message.strip() or (first_error(run, test) if "::" in test else "")
for key, n in count.most_common():
    print(f"  {n}x {key}\n      {first[key][:300]}")
EOF
exit 1
