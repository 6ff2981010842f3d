#!/usr/bin/env bash
# The project's one version (docs/versioning.md): Cargo.toml's workspace version, which the
# chart's `version` and `appVersion` ("v" + it) must follow. hack/release.sh and the release
# workflow both ask here, so the rule is written once.
#   hack/version.sh                 print the version, or fail naming the file that disagrees
#   hack/version.sh --tag vX.Y.Z    also: the git tag names it and CHANGELOG.md has a dated section
set -euo pipefail
source "$(dirname "$0")/lib.sh"

usage() { echo "usage: $0 [--tag vX.Y.Z]" >&2; exit 2; }

tag=""
case "$#" in
  0) ;;
  2) [[ "$1" == "--tag" ]] || usage; tag="$2" ;;
  *) usage ;;
esac

cargo_toml="$NODEIPAM_ROOT/Cargo.toml"
chart="$NODEIPAM_ROOT/charts/nodeipam/Chart.yaml"
# The first `version = "..."` is [workspace.package]'s: every crate inherits it.
version="$(nodeipam_version)"
chart_version="$(sed -n 's/^version: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$chart")"
app_version="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$chart")"

[[ -n "$version" ]] || die "step=version: $cargo_toml has no workspace version"
# SemVer 2.0 with an optional pre-release such as -rc.1 (docs/versioning.md).
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] \
  || die "step=version: $cargo_toml: version \"$version\" is not X.Y.Z or X.Y.Z-pre"
[[ "$chart_version" == "$version" ]] \
  || die "step=version: $chart: version \"$chart_version\" is not Cargo.toml's \"$version\""
[[ "$app_version" == "v$version" ]] \
  || die "step=version: $chart: appVersion \"$app_version\" is not \"v$version\" (Cargo.toml's version)"

if [[ -n "$tag" ]]; then
  [[ "$tag" == "v$version" ]] || die "step=version: tag \"$tag\" is not \"v$version\" (Cargo.toml's version)"
  grep -q "^## \[$version\] - [0-9]" "$NODEIPAM_ROOT/CHANGELOG.md" \
    || die "step=version: CHANGELOG.md has no dated section \"## [$version] - YYYY-MM-DD\""
fi
echo "$version"
