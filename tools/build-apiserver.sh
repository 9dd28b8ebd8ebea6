#!/usr/bin/env bash
# Builds kube-apiserver and kube-proxy v1.36.3 from the k8s.io/kubernetes Go
# module pinned in tools/go.mod, into a cache directory shared between runs:
#   ${KPROXY_CACHE:-$HOME/.cache/kproxy}/bin/v1.36.3/{kube-apiserver,kube-proxy}
# A binary that exists and is newer than tools/go.sum (and this script) is
# not rebuilt. Prints the directory of the binaries on its last line.
set -euo pipefail
cd "$(dirname "$0")"

version=v1.36.3
out="${KPROXY_CACHE:-$HOME/.cache/kproxy}/bin/${version}"
cmds=(kube-apiserver kube-proxy)

stale=()
for c in "${cmds[@]}"; do
  if [ -x "$out/$c" ] && [ "$out/$c" -nt go.sum ] && [ "$out/$c" -nt "$0" ]; then
    echo "build-apiserver: $out/$c is up to date"
  else
    stale+=("k8s.io/kubernetes/cmd/$c")
  fi
done

if [ "${#stale[@]}" -gt 0 ]; then
  mkdir -p "$out"
  tmp=$(mktemp -d "$out/.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${version}"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36"
  ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  echo "build-apiserver: building ${stale[*]} ${version} (cold build takes minutes)"
  start=$(date +%s)
  CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$tmp/" "${stale[@]}"
  for p in "${stale[@]}"; do
    mv -f "$tmp/${p##*/}" "$out/${p##*/}"
  done
  echo "build-apiserver: built in $(( $(date +%s) - start ))s"
fi
"$out/kube-apiserver" --version
echo "$out"
