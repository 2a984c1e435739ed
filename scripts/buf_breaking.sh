#!/usr/bin/env bash
# buf breaking against the previous commit: does this commit's proto/ break the contracts?
#
# What it decides: whether the work tree's .proto files (the module buf.yaml names) are
# compatible with HEAD~1's under buf.yaml's `breaking` rules (category FILE: wire, JSON and
# generated-code compatibility; see docs/reference/clients.md). Exit 0 when compatible, 1 when
# not (buf names each file, line, field and change), 2 when the check cannot run.
#
# Why HEAD~1: CI checks each submitted commit against the one before it, so a renumbered field
# or a changed type fails the commit that makes it. Without a previous commit there is nothing
# to compare:
#   * the first commit of a repository: nothing to break; says so and exits 0, anywhere;
#   * a shallow clone (HEAD~1 exists but was not fetched): it first tries to fetch one more
#     commit (git fetch --deepen=1); when that cannot work (no remote, offline) it says so in
#     one line and exits 0 — loudly, with "WARNING" under CI (CI set, not ""/0/false) — rather
#     than failing a build over a clone it did not make.
#
# Runs in the git repository of the current directory (so a test can point it at a scratch
# repository); buf is the project's pinned copy (.tools, installed by `make lint`), or $BUF.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
buf="${BUF:-$here/../.tools/node_modules/.bin/buf}"
against_ref="${BUF_BREAKING_AGAINST:-HEAD~1}"

in_ci() {
  case "$(printf '%s' "${CI:-}" | tr '[:upper:]' '[:lower:]')" in
    "" | 0 | false) return 1 ;;
    *) return 0 ;;
  esac
}

if [[ ! -x "$buf" ]]; then
  echo "buf_breaking: buf not found at $buf (make lint installs it:" \
    "npm install --prefix .tools @bufbuild/buf@1.75.0)" >&2
  exit 2
fi

top="$(git rev-parse --show-toplevel 2>/dev/null)" || {
  echo "buf_breaking: $(pwd) is not in a git repository" >&2
  exit 2
}
cd "$top"

if ! git rev-parse --verify --quiet "${against_ref}^{commit}" >/dev/null; then
  if [[ "$(git rev-parse --is-shallow-repository)" == "true" ]]; then
    git fetch --quiet --deepen=1 2>/dev/null || true
  fi
  if ! git rev-parse --verify --quiet "${against_ref}^{commit}" >/dev/null; then
    if [[ "$(git rev-parse --is-shallow-repository)" == "true" ]]; then
      warn=""
      in_ci && warn="WARNING: "
      echo "buf_breaking: ${warn}skipped: $against_ref is not in this shallow clone and could" \
        "not be fetched (git fetch --deepen=1 to check)" >&2
      exit 0
    fi
    echo "buf_breaking: skipped: $against_ref does not exist (the first commit has nothing to break)"
    exit 0
  fi
fi

status=0
"$buf" breaking --against ".git#ref=${against_ref}" || status=$?
if [[ $status -eq 0 ]]; then
  echo "buf_breaking: proto/ is compatible with $against_ref ($(git rev-parse --short "$against_ref"))"
  exit 0
fi
if [[ $status -eq 100 ]]; then
  # buf's exit code for "breaking changes found"; it printed them above.
  echo "buf_breaking: proto/ breaks compatibility with $against_ref (rules: buf.yaml breaking)" >&2
  exit 1
fi
echo "buf_breaking: buf breaking failed to run (exit $status)" >&2
exit 2
