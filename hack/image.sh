#!/usr/bin/env bash
# Builds the nodeipam controller image from the project's Containerfile with buildah, without a
# registry: the release binary is compiled on the host (the Rust base image cannot be pulled
# here) and the runtime is an empty base plus the glibc libraries that binary links, copied
# from the host (the "prebuilt" and "hostlibs" stages). The result is an OCI archive that
# `ctr images import` loads on every node of hack/cluster.sh.
#   hack/image.sh [build]   build (a no-op when the binary and the Containerfile are unchanged)
#   hack/image.sh path      print the path of the OCI archive
# The image is tagged $NODEIPAM_IMAGE (default the release's, docker.io/library/nodeipam:vX.Y.Z
# from Cargo.toml's version: what config/default and the chart deploy unchanged, so the local
# cluster runs the image a release ships); the archive's org.opencontainers.image.ref.name is
# that name too. Each tag has its own archive and stamp
# (hack/release.sh builds the release tag), so building one never invalidates another.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

IMAGE="${NODEIPAM_IMAGE:-$NODEIPAM_RELEASE_IMAGE_DEFAULT}"
IMAGE_DIR="$NODEIPAM_CACHE/image"
# The tag as a file name: / and : become _.
ARCHIVE="$IMAGE_DIR/${IMAGE//[^A-Za-z0-9._-]/_}.oci.tar"
STAMP="$ARCHIVE.stamp"
# buildah's own storage, apart from /var/lib/containers: vfs needs no overlay or fuse support.
BUILDAH=(buildah --root "$IMAGE_DIR/storage" --runroot "$IMAGE_DIR/run" --storage-driver vfs)

cmd_build() {
  command -v buildah >/dev/null || die "step=image: buildah is not installed (hack/cluster.sh build installs it)"
  claim_target
  timed "cargo build --release nodeipam" cargo build --quiet --release --locked \
    --manifest-path "$NODEIPAM_ROOT/Cargo.toml" -p nodeipam-controller --bin nodeipam
  local bin="$CARGO_TARGET_DIR/release/nodeipam"
  [[ -x "$bin" ]] || die "step=image: no binary at $bin after cargo build"

  local ctx="$IMAGE_DIR/context"
  rm -rf "$ctx" && mkdir -p "$ctx/rootfs/etc"
  # Symbols only: release builds already carry no debug info; panics keep their messages.
  strip -o "$ctx/nodeipam" "$bin"
  # The loader and every library the binary links, at the paths the loader looks in.
  local lib
  for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
    mkdir -p "$ctx/rootfs$(dirname "$lib")"
    cp -L "$lib" "$ctx/rootfs$lib"
  done
  # What distroless's nonroot variant has, so that tools show a name for uid 65532.
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$ctx/rootfs/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$ctx/rootfs/etc/group"

  local stamp
  stamp="$( (cd "$ctx" && find . -type f -print0 | sort -z | xargs -0 sha256sum; cat "$NODEIPAM_ROOT/Containerfile"; echo "$IMAGE") | sha256sum | cut -c1-16)"
  if [[ -f "$ARCHIVE" && -f "$STAMP" && "$(cat "$STAMP")" == "$stamp" ]]; then
    log "image $IMAGE up to date in $ARCHIVE"
    return 0
  fi
  timed "buildah bud $IMAGE" "${BUILDAH[@]}" bud --quiet --isolation chroot \
    -f "$NODEIPAM_ROOT/Containerfile" --build-arg BINARY=prebuilt --build-arg RUNTIME=hostlibs \
    -t "$IMAGE" "$ctx"
  rm -f "$ARCHIVE"
  timed "buildah push $IMAGE to $ARCHIVE" "${BUILDAH[@]}" push --quiet "$IMAGE" "oci-archive:$ARCHIVE:$IMAGE"
  # Only the archive is kept: vfs stores every layer in full.
  "${BUILDAH[@]}" rmi --all >/dev/null 2>&1 || true
  echo "$stamp" >"$STAMP"
  log "image $IMAGE: archive $(du -h "$ARCHIVE" | cut -f1) (layers compressed), stripped binary $(du -h "$ctx/nodeipam" | cut -f1), uncompressed $(du -sh "$ctx" | cut -f1)"
}

case "${1:-build}" in
  build) cmd_build ;;
  path) echo "$ARCHIVE" ;;
  *) echo "usage: $0 [build|path]" >&2; exit 2 ;;
esac
