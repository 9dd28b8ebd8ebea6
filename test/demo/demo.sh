#!/usr/bin/env bash
# `sudo make demo`: run kproxy for real in a throwaway sandbox of network
# namespaces (see test/demo/main.go). Everything it creates is named
# kptd<pid>-* and removed on exit, also on failure or ^C.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "$(id -u)" != 0 ]; then
	echo "demo: needs root: sudo make demo" >&2
	exit 1
fi
GO=${GO:-go}
[ -x bin/kproxy ] && [ -x bin/kproxy-echo ] || make build
"$GO" build -o bin/kproxy-demo ./test/demo
PREFIX="kptd$$-"
cleanup() {
	# Second line of defence: the demo tears down itself; this only removes
	# what a killed demo left behind (its processes die with it: pdeathsig).
	for ns in $(ip netns list | awk '{print $1}' | grep "^${PREFIX}" || true); do
		ip netns delete "$ns" || true
	done
}
trap cleanup EXIT
bin/kproxy-demo --prefix "$PREFIX" --kproxy bin/kproxy --echo bin/kproxy-echo \
	--source examples/demo.yaml "$@"
