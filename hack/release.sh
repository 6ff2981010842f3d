#!/usr/bin/env bash
# Makes every artifact of a release, for the version in Cargo.toml (hack/version.sh refuses when
# the chart does not follow it), into one folder, without a registry or a forge:
#   nodeipam-image-vX.Y.Z-<os>-<arch>.oci.tar   the controller image (hack/image.sh), tagged
#                                               $NODEIPAM_RELEASE_IMAGE:vX.Y.Z
#   kubectl-nodeipam-vX.Y.Z-<os>-<arch>.tar.gz  the kubectl plugin and LICENSE, per platform
#   nodeipam-X.Y.Z.tgz                          the Helm chart (`helm package`)
#   nodeipam.yaml                               the krew plugin manifest for the tarballs
#   SHA256SUMS                                  `sha256sum -c` checks every file above
# Publishing them is the release workflow's (.github/workflows/release.yaml).
#
#   hack/release.sh [--out DIR]      default DIR: $NODEIPAM_CACHE/release/<version>
#
# Environment:
#   NODEIPAM_RELEASE_IMAGE    the image's repository (default nodeipam, as docker.io/library/nodeipam:
#                             what the chart's and config/'s default `nodeipam` means to a kubelet)
#   NODEIPAM_RELEASE_URL      where the tarballs will be downloaded from, the krew manifest's `uri`
#                             base (default <Cargo.toml repository>/releases/download/vX.Y.Z)
#   NODEIPAM_RELEASE_TARGETS  Rust targets to build the plugin for, space-separated (default the
#                             host's); each must be installed (`rustup target list --installed`)
#                             with a linker for it
set -euo pipefail
source "$(dirname "$0")/lib.sh"

usage() { echo "usage: $0 [--out DIR]" >&2; exit 2; }

out=""
while (($#)); do
  case "$1" in
    --out) [[ $# -ge 2 && -n "$2" ]] || usage; out="$2"; shift 2 ;;
    *) usage ;;
  esac
done

version="$("$NODEIPAM_ROOT/hack/version.sh")" || exit 1
tag="v$version"
out="${out:-$NODEIPAM_CACHE/release/$version}"
mkdir -p "$out" || die "step=out: cannot create $out"
out="$(cd "$out" && pwd)"

repository="$(sed -n 's/^repository = "\(.*\)"$/\1/p' "$NODEIPAM_ROOT/Cargo.toml" | head -1)"
[[ -n "$repository" ]] || die "step=version: Cargo.toml has no workspace repository (the plugin's homepage)"
release_url="${NODEIPAM_RELEASE_URL:-$repository/releases/download/$tag}"
host="$(rustc -vV | sed -n 's/^host: //p')"
targets="${NODEIPAM_RELEASE_TARGETS:-$host}"
made=()

# platform TRIPLE: prints "<os> <arch>" as krew's selectors (Go's GOOS/GOARCH) name them.
platform() {
  local os arch
  case "$1" in
    *-linux-*) os=linux ;;
    *-apple-darwin) os=darwin ;;
    *) die "step=plugin: target $1: no krew os for it (linux and darwin are supported)" ;;
  esac
  case "$1" in
    x86_64-*) arch=amd64 ;;
    aarch64-*) arch=arm64 ;;
    *) die "step=plugin: target $1: no krew arch for it (x86_64 and aarch64 are supported)" ;;
  esac
  echo "$os $arch"
}

# A fixed time in every archive (the last commit's), so the same tree gives the same bytes.
epoch="$(git -C "$NODEIPAM_ROOT" log -1 --format=%ct 2>/dev/null || echo 0)"

build_image() {
  local image="${NODEIPAM_RELEASE_IMAGE:-docker.io/library/nodeipam}:$tag" os arch archive
  read -r os arch < <(platform "$host")
  NODEIPAM_IMAGE="$image" "$NODEIPAM_ROOT/hack/image.sh" build || die "step=image: hack/image.sh build $image failed"
  archive="$(NODEIPAM_IMAGE="$image" "$NODEIPAM_ROOT/hack/image.sh" path)"
  local name="nodeipam-image-$tag-$os-$arch.oci.tar"
  cp "$archive" "$out/$name" || die "step=image: cannot copy $archive to $out"
  made+=("$name")
}

# build_plugin TRIPLE: the plugin's tarball for TRIPLE; appends "os arch name" to $plugins.
plugins=()
build_plugin() {
  local triple="$1" os arch dir bin
  read -r os arch < <(platform "$triple")
  local args=(--quiet --release --locked --manifest-path "$NODEIPAM_ROOT/Cargo.toml" -p nodeipam-cli --bin kubectl-nodeipam)
  dir="$CARGO_TARGET_DIR/release"
  # The host's build shares its folder with the image's; another target has its own.
  if [[ "$triple" != "$host" ]]; then
    args+=(--target "$triple")
    dir="$CARGO_TARGET_DIR/$triple/release"
  fi
  timed "cargo build --release kubectl-nodeipam ($triple)" cargo build "${args[@]}"
  bin="$dir/kubectl-nodeipam"
  [[ -x "$bin" ]] || die "step=plugin: no binary at $bin after cargo build"
  local stage
  stage="$(mktemp -d)"
  # The host's strip knows only the host's format.
  if [[ "$triple" == "$host" ]]; then strip -o "$stage/kubectl-nodeipam" "$bin"; else cp "$bin" "$stage/"; fi
  cp "$NODEIPAM_ROOT/LICENSE" "$stage/LICENSE"
  local name="kubectl-nodeipam-$tag-$os-$arch.tar.gz"
  tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" -cf - kubectl-nodeipam LICENSE \
    | gzip -n >"$out/$name" || die "step=plugin: cannot write $out/$name"
  rm -rf "$stage"
  made+=("$name")
  plugins+=("$os $arch $name")
}

package_chart() {
  [[ -x "$NODEIPAM_HELM" ]] || die "step=chart: no helm at $NODEIPAM_HELM: run hack/helm.sh build"
  local home
  home="$(mktemp -d)"
  # Helm's cache and config in a temporary folder: the user's Helm state is not read or written.
  HELM_CACHE_HOME="$home/cache" HELM_CONFIG_HOME="$home/config" HELM_DATA_HOME="$home/data" \
    "$NODEIPAM_HELM" package "$NODEIPAM_ROOT/charts/nodeipam" -d "$out" >/dev/null \
    || die "step=chart: helm package charts/nodeipam failed"
  rm -rf "$home"
  [[ -f "$out/nodeipam-$version.tgz" ]] || die "step=chart: helm package made no $out/nodeipam-$version.tgz"
  made+=("nodeipam-$version.tgz")
}

# The krew manifest (krew.sigs.k8s.io: plugin manifest v1alpha2): one platform per tarball.
write_krew_manifest() {
  local m="$out/nodeipam.yaml" entry os arch name sum
  {
    cat <<EOF
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: nodeipam
spec:
  version: $tag
  homepage: $repository
  shortDescription: Show and check the pod network that nodeipam allocates
  description: |
    kubectl nodeipam reads a cluster with nodeipam (a node IPAM controller that hands out
    podCIDRs from many discontiguous ranges) and shows its ranges, which node has which
    block, the controller's status and the pod network for consumers; it checks that what
    is written agrees with the configs, and migrates ClusterCIDR objects to NodeIPAMConfigs.
  platforms:
EOF
    for entry in "${plugins[@]}"; do
      read -r os arch name <<<"$entry"
      sum="$(sha256sum "$out/$name" | cut -d' ' -f1)"
      cat <<EOF
  - selector:
      matchLabels:
        os: $os
        arch: $arch
    uri: $release_url/$name
    sha256: $sum
    files:
    - from: kubectl-nodeipam
      to: .
    - from: LICENSE
      to: .
    bin: kubectl-nodeipam
EOF
    done
  } >"$m"
  made+=("nodeipam.yaml")
}

# Every target is checked before anything is built: a bad one fails in a second, not after
# the image.
for triple in $targets; do
  platform "$triple" >/dev/null
  [[ "$triple" == "$host" ]] || rustup target list --installed 2>/dev/null | grep -qx "$triple" \
    || die "step=plugin: Rust target $triple is not installed (rustup target add $triple, and a linker for it)"
done
claim_target
log "release $tag into $out"
build_image
for triple in $targets; do build_plugin "$triple"; done
package_chart
write_krew_manifest
(cd "$out" && sha256sum "${made[@]}") >"$out/SHA256SUMS" || die "step=checksums: sha256sum in $out failed"
log "release $tag: $(printf '%s ' "${made[@]}")SHA256SUMS in $out"
