#!/usr/bin/env bash
# Builds the testbed's control plane and upstream's proxy from the Go modules
# pinned in tools/go.mod, into a cache directory shared between runs:
#   ${KPROXY_CACHE:-$HOME/.cache/kproxy}/bin/v1.36.3/{kube-apiserver,kube-proxy,etcd}
# kube-apiserver and kube-proxy come from k8s.io/kubernetes v1.36.3, etcd
# from go.etcd.io/etcd/server/v3 (the version kubeadm 1.36 deploys). A binary
# that exists and is newer than tools/go.sum (and this script) is not
# rebuilt. Prints the directory of the binaries on its last line.
set -euo pipefail
cd "$(dirname "$0")"

version=v1.36.3
out="${KPROXY_CACHE:-$HOME/.cache/kproxy}/bin/${version}"
declare -A pkg=(
  [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  [kube-proxy]=k8s.io/kubernetes/cmd/kube-proxy
  [etcd]=go.etcd.io/etcd/server/v3
)

stale=()
for c in kube-apiserver kube-proxy etcd; do
  if [ -x "$out/$c" ] && [ "$out/$c" -nt go.sum ] && [ "$out/$c" -nt "$0" ]; then
    echo "build-apiserver: $out/$c is up to date"
  else
    stale+=("$c")
  fi
done

if [ "${#stale[@]}" -gt 0 ]; then
  mkdir -p "$out"
  tmp=$(mktemp -d "$out/.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  k8s=()
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${version}"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36"
  ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  echo "build-apiserver: building ${stale[*]} (cold build takes minutes)"
  start=$(date +%s)
  for c in "${stale[@]}"; do
    case $c in
      etcd) CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" "${pkg[etcd]}" ;;
      *) k8s+=("${pkg[$c]}") ;;
    esac
  done
  if [ "${#k8s[@]}" -gt 0 ]; then
    CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$tmp/" "${k8s[@]}"
  fi
  for c in "${stale[@]}"; do
    mv -f "$tmp/$c" "$out/$c"
  done
  echo "build-apiserver: built in $(( $(date +%s) - start ))s"
fi
"$out/kube-apiserver" --version
# sed reads to the end: head would leave etcd a closed pipe (SIGPIPE under pipefail).
"$out/etcd" --version | sed -n 1p
echo "$out"
