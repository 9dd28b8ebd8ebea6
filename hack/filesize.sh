#!/usr/bin/env bash
# make lint: no non-test Go file grows past MAX lines (CONTRIBUTING.md: one
# job per file; a file this long is two). A file listed in ALLOW may, with
# the reason and the issue that splits it; remove it from the list then.
set -euo pipefail
MAX=${MAX:-900}
ALLOW=()
bad=0
while read -r n f; do
	[ "$f" = total ] && continue
	if [ "$n" -gt "$MAX" ] && ! printf '%s\n' "${ALLOW[@]}" | grep -x "$f" >/dev/null; then
		echo "filesize: $f has $n lines (limit $MAX; see hack/filesize.sh)"
		bad=1
	fi
done < <(git ls-files '*.go' | grep -v '_test\.go$' | xargs wc -l)
exit $bad
