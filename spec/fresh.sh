#!/usr/bin/env bash
# make test-fresh: the README's two set-up lines, exactly as written, as root
# on a minimal Debian bookworm root (debootstrap --variant=minbase) with this
# repository's committed tree copied in.  The main job (make run) is started,
# asked for one completion through the gateway, then stopped with SIGINT as a
# person would; the test line must end "N passed, 0 failed".
#
# The minbase root is made once and kept (FRESH_BASE); each run works on a
# fresh copy of it.  FRESH_REBUILD=1 makes the base again.  Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${FRESH_BASE:-/var/tmp/lupin-fresh.base}
root=${FRESH_ROOT:-/var/tmp/lupin-fresh}
mirror=${FRESH_MIRROR:-http://deb.debian.org/debian}

[ "$(id -u)" = 0 ] || { echo "test-fresh: needs root (debootstrap, chroot, mount)" >&2; exit 1; }
command -v debootstrap >/dev/null || { apt-get update -qq; apt-get install -y -qq debootstrap; }

if [ "${FRESH_REBUILD:-}" = 1 ] || [ ! -e "$base/.complete" ]; then
  rm -rf "$base"
  echo "test-fresh: debootstrap --variant=minbase bookworm $base"
  debootstrap --variant=minbase bookworm "$base" "$mirror" > "$base.log" 2>&1 ||
    { tail -20 "$base.log"; exit 1; }
  touch "$base/.complete"
fi

mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
  mounted=()
}
trap cleanup EXIT INT TERM
rm -rf "$root"
cp -a "$base" "$root"
for fs in proc sys dev; do
  mount --rbind "/$fs" "$root/$fs"
  mounted+=("$root/$fs")
done
cp /etc/resolv.conf "$root/etc/resolv.conf"
# the hosts file a Debian installer writes: localhost is ::1 as well
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n' \
  > "$root/etc/hosts"
mkdir -p "$root/root/lupin"
git archive HEAD | tar -x -C "$root/root/lupin" # what a clone has: committed files only

# the two lines of the README's first sh block, comments cut
mapfile -t lines < <(awk '/^```sh$/ {on = 1; next} on && /^```$/ {exit} on' README.md |
  sed 's/[[:space:]]*#.*$//' | grep -v '^[[:space:]]*$')
[ "${#lines[@]}" = 2 ] || { echo "test-fresh: README's first sh block is not two lines" >&2; exit 1; }
run_line=${lines[0]}
test_line=${lines[1]}
in_root() { chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin \
  TERM=dumb /bin/bash -c "cd /root/lupin && $1"; }

echo "test-fresh: 1. $run_line"
log=$root/root/run.log
# in a session of its own, so that Ctrl-C (SIGINT to its process group) ends it
setsid chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin TERM=dumb \
  /bin/bash -c "cd /root/lupin && $run_line" > "$log" 2>&1 &
job=$!
answered=
for _ in $(seq 1800); do # make deps and the build come first: up to 15 minutes
  if ! kill -0 "$job" 2>/dev/null; then break; fi
  if grep -q "Ctrl-C stops everything" "$log" &&
    curl -s -m 10 http://127.0.0.1:8080/v1/completions -H 'content-type: application/json' \
      -d '{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"Hi","max_tokens":4}' |
    grep -q '"text_completion"'; then
    answered=1
    break
  fi
  sleep 0.5
done
kill -INT -- "-$job" 2>/dev/null || true
wait "$job" 2>/dev/null || true
tail -5 "$log"
[ -n "$answered" ] || { echo "test-fresh: make run did not answer a completion" >&2; exit 1; }
echo "test-fresh: make run answered a completion through the gateway"

echo "test-fresh: 2. $test_line"
tlog=$root/root/test.log
in_root "$test_line" > "$tlog" 2>&1 || true
tail -3 "$tlog"
final=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$tlog" | tail -1)
echo "test-fresh: $final"
[[ "$final" =~ ^[0-9]+\ passed,\ 0\ failed ]]
