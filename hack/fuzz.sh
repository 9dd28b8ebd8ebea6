#!/usr/bin/env bash
# Runs every Fuzz target under internal/ for a short, bounded time each.
set -euo pipefail
t=${1:-20s}
found=0
for pkg in $(go list ./internal/...); do
  for f in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    found=1
    echo "fuzz: $pkg $f ($t)"
    go test -run "^$" -fuzz "^${f}\$" -fuzztime "$t" -fuzzminimizetime 0s "$pkg"
  done
done
[ "$found" = 1 ] || echo "fuzz: no fuzz targets yet"
