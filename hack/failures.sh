#!/usr/bin/env bash
# Prints, for each failed test in a `go test -v` log, the last lines that
# test wrote, so a run whose output is filtered (the Makefile keeps only the
# === RUN / --- lines) still says what failed and why. Usage:
#   hack/failures.sh bin/e2e.log
# Go streams -v output and names the test that writes with === RUN, === CONT
# or === NAME; a line belongs to the test last named.
set -euo pipefail
log=${1:?usage: hack/failures.sh LOG}
[ -f "$log" ] || exit 0
awk -v keep=40 '
  /^=== (RUN|CONT|NAME|PAUSE) / { cur = $3; next }
  /^ *--- FAIL: / { name = $3; if (!(name in failed)) { failed[name] = 1; order[++n] = name }; next }
  /^ *--- (PASS|SKIP): / { next }
  cur != "" {
    c = ++count[cur]; lines[cur, c] = $0
    if (c > keep) delete lines[cur, c - keep]
  }
  END {
    if (n == 0) exit
    printf "::: failed tests (%d), each with its last %d lines:\n", n, keep
    for (i = 1; i <= n; i++) {
      name = order[i]
      leaf = 1
      for (j = 1; j <= n; j++) if (j != i && index(order[j], name "/") == 1) leaf = 0
      if (!leaf) { print "--- FAIL: " name " (see its subtests)"; continue }
      print "--- FAIL: " name
      from = count[name] - keep + 1; if (from < 1) from = 1
      for (c = from; c <= count[name]; c++) print lines[name, c]
    }
  }' "$log"
