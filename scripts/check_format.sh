#!/usr/bin/env bash
# Checks that every C++ file of the project is formatted as .clang-format says (the test command
# runs it as the ctest `format`); `--fix` formats them instead.
#   scripts/check_format.sh [--fix]
# clang-format's output differs between major versions: the files are formatted with Debian 12's
# clang-format 14 (scripts/setup.sh installs it). With another major version the check is skipped
# (exit status 77, which ctest reports as skipped) and says so: reformatting with it would touch
# lines nobody changed.
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
WANT_MAJOR=14
command -v "$CLANG_FORMAT" >/dev/null || { echo "$CLANG_FORMAT is missing: run scripts/setup.sh --system" >&2; exit 1; }
major=$("$CLANG_FORMAT" --version | sed -n 's/.*version \([0-9][0-9]*\)\..*/\1/p')
if [ "$major" != "$WANT_MAJOR" ]; then
  echo "skipped: $CLANG_FORMAT is version ${major:-unknown}, and the files are formatted with version $WANT_MAJOR" \
    "(set CLANG_FORMAT to a clang-format-$WANT_MAJOR)"
  exit 77
fi
# The check must be able to fail: a line over 100 columns, as this tree's style sees it.
if printf 'int f(int a, int b) { return a + b + a + b + a + b + a + b + a + b + a + b + a + b + a + b + a + b + a + b + a; }\n' \
  | "$CLANG_FORMAT" --dry-run --Werror --assume-filename=server/format_check.cc 2>/dev/null; then
  echo "clang-format accepted an unformatted line: is .clang-format (ColumnLimit 100) being read?" >&2
  exit 1
fi
mapfile -t files < <(git ls-files '*.cc' '*.h' | grep -v '^proto/')
if [ "${1:-}" = --fix ]; then
  "$CLANG_FORMAT" -i "${files[@]}"
  echo "formatted ${#files[@]} files"
  exit 0
fi
if ! "$CLANG_FORMAT" --dry-run --Werror "${files[@]}"; then
  echo "some lines are not formatted as .clang-format says (above): run scripts/check_format.sh --fix" >&2
  exit 1
fi
echo "${#files[@]} files formatted as .clang-format says"
