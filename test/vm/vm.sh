#!/usr/bin/env bash
# Runs one command on Debian's stock kernel (which has IPVS, SCTP and dummy
# interfaces; this machine's has none of them) under qemu, with the host's
# root filesystem as the guest's: a read-only 9p view of / under a tmpfs
# overlay (writes stay in the guest), a fresh tmpfs on /run, the kernel's
# modules bind-mounted at /lib/modules/$KVER and busybox standing in for
# modprobe. The host's binaries (iptables, ipset, nft, etcd, kube-apiserver,
# test binaries) run in the guest unchanged. The command's output goes to a
# writable 9p share and is printed when it ends; the script exits with the
# command's status.
#
#   test/vm/vm.sh [-m MiB] [-c CPUS] [-t SECONDS] [-e VAR]... [-k DIR] -- command [args]
#
# -k DIR: the guest sees a copy of DIR at $VM_KEEP (writable), and what it
# leaves there is copied back into DIR when the command ends (results of a
# benchmark run in the guest, for example).
#
# The kernel package (apt-get download linux-image-amd64's dependency) is
# fetched once into ${KPROXY_CACHE:-$HOME/.cache/kproxy}/vm. KVM does not
# boot a stock kernel on these machines: qemu runs with TCG.
set -euo pipefail

mem=6144 cpus=2 timeout=1800 keep=
passenv=(CI)
while [ $# -gt 0 ]; do
  case "$1" in
    -m) mem=$2; shift 2 ;;
    -c) cpus=$2; shift 2 ;;
    -t) timeout=$2; shift 2 ;;
    -e) passenv+=("$2"); shift 2 ;;
    -k) keep=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "vm.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: vm.sh [options] -- command [args]" >&2; exit 2; }

log() { echo "vm.sh: $*" >&2; }
cache=${KPROXY_CACHE:-$HOME/.cache/kproxy}/vm
mkdir -p "$cache"

# --- the kernel ---------------------------------------------------------------
kernel_pkg() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}' || true; }
pkg=$(kernel_pkg)
if [ -z "$pkg" ] && [ "$(id -u)" = 0 ] && ! compgen -G "$cache/linux-image-*" >/dev/null; then
  log "no package lists: apt-get update"
  apt-get update -qq >/dev/null 2>&1 || true
  pkg=$(kernel_pkg)
fi
if [ -z "$pkg" ]; then
  # No package lists (offline): the newest kernel already cached.
  pkg=$(ls "$cache" 2>/dev/null | grep '^linux-image-' | sort -V | tail -n 1 || true)
fi
[ -n "$pkg" ] || { log "no linux-image package known (run apt-get update)"; exit 1; }
kdir=$cache/$pkg
kver=${pkg#linux-image-}
if [ ! -f "$kdir/.ready" ]; then
  log "fetching $pkg (once)"
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download "$pkg" >/dev/null 2>&1) || { rm -rf "$tmp"; log "apt-get download $pkg failed"; exit 1; }
  rm -rf "$kdir"
  dpkg -x "$tmp"/*.deb "$kdir"
  rm -rf "$tmp"
  busybox depmod -b "$kdir" "$kver"
  touch "$kdir/.ready"
fi
vmlinuz=$kdir/boot/vmlinuz-$kver
moddir=$kdir/lib/modules/$kver

# --- the initramfs: busybox, the modules to mount the host's root ------------
initrd=$cache/initrd-$kver.cpio.gz
if [ ! -f "$initrd" ] || [ "$initrd" -ot "$0" ] || [ "$initrd" -ot "$(dirname "$0")/init" ]; then
  log "building $initrd"
  ir=$(mktemp -d)
  mkdir -p "$ir"/{bin,proc,sys,dev,lower,upper,newroot,lib/modules/$kver}
  cp /bin/busybox "$ir/bin/busybox"
  # The boot modules and everything they depend on (modules.dep).
  want="virtio_pci 9pnet_virtio 9p overlay"
  files=""
  for m in $want; do
    line=$(grep -E "/$m\.ko:" "$moddir/modules.dep")
    files="$files ${line%%:*} ${line#*:}"
  done
  for f in $files; do
    mkdir -p "$ir/lib/modules/$kver/$(dirname "$f")"
    cp "$moddir/$f" "$ir/lib/modules/$kver/$f"
  done
  cp "$moddir/modules.dep" "$ir/lib/modules/$kver/"
  cp "$(dirname "$0")/init" "$ir/init"
  chmod +x "$ir/init"
  (cd "$ir" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) > "$initrd.tmp"
  mv "$initrd.tmp" "$initrd"
  rm -rf "$ir"
fi

# --- the guest's script -------------------------------------------------------
out=$(mktemp -d /tmp/kproxy-vm.XXXXXX)
trap 'rm -rf "$out"' EXIT
{
  echo "export PATH=/run/vmbin:$PATH"
  echo "export HOME=$HOME KPROXY_VM=1"
  [ -z "$keep" ] || echo "export VM_KEEP=/vmout/keep"
  for v in "${passenv[@]}"; do
    [ -n "${!v+x}" ] && printf 'export %s=%q\n' "$v" "${!v}"
  done
  printf 'cd %q\n' "$PWD"
  # The output goes to the writable share, not the serial console (115200
  # baud: a verbose test run would be throttled and cut).
  printf '%q ' "$@"; echo '> /vmout/output 2>&1'
  echo 'echo $? > /vmout/rc'
} > "$out/cmd.sh"
: > "$out/output"
if [ -n "$keep" ]; then
  mkdir -p "$out/keep" "$keep"
  cp -a "$keep/." "$out/keep/"
fi

log "booting $kver (TCG, $cpus CPUs, $mem MiB) to run: $*"
log "the command's output: $out/output (printed when it ends)"
rc=0
timeout --kill-after=10 "$timeout" qemu-system-x86_64 -accel tcg -smp "$cpus" -m "$mem" \
  -nographic -no-reboot -nic none -serial mon:stdio -display none \
  -kernel "$vmlinuz" -initrd "$initrd" \
  -append "console=ttyS0 loglevel=5 softlockup_all_cpu_backtrace=1 panic=-1 kver=$kver kmods=$moddir" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -virtfs local,path="$out",mount_tag=vmout,security_model=none \
  </dev/null >"$out/console" 2>&1 || rc=$?
cat "$out/output"
[ -z "$keep" ] || cp -a "$out/keep/." "$keep/"
if [ "$rc" -ne 0 ]; then
  log "qemu's console:"
  tail -n 30 "$out/console" >&2
  log "qemu exited with $rc"
fi
if [ ! -f "$out/rc" ]; then
  log "the command did not finish (no exit status from the guest); console:"
  tail -n 150 "$out/console" >&2
  exit 1
fi
exit "$(cat "$out/rc")"
