#!/bin/sh
# Runs inside the VM (make e2e-ipvs): the e2e suite's IPVS-mode tests, then
# the SCTP case in nftables, iptables and userspace mode (the host's kernel
# has no SCTP).
# Usage: e2e.sh E2E_TEST RUN SKIP SCTP_RUN; an empty SCTP_RUN skips the second
# stage. The exit status is 1 when either stage failed.
set -u
bin=$(realpath "$1") run=$2 skip=$3 sctp=$4
cd test/e2e || exit 1
s=0
KPROXY_E2E_MODES=ipvs "$bin" -test.run "$run" -test.skip "$skip" -test.v -test.timeout 40m || s=1
if [ -n "$sctp" ]; then
  KPROXY_E2E_MODES=nftables,iptables,userspace "$bin" -test.run "$sctp" -test.v -test.timeout 15m || s=1
fi
exit $s
