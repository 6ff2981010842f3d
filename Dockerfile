# syntax=docker/dockerfile:1
# The nodeipam controller image: docker build -t nodeipam:latest .
# Two stages: a Rust toolchain builds the release binary; the runtime is distroless (no shell,
# no package manager) and runs as the nonroot user, uid 65532, as config/manager expects.

FROM docker.io/library/rust:1.89-bookworm AS builder
WORKDIR /src
# The whole workspace: cargo needs every member's manifest and sources to resolve it.
# .dockerignore keeps build output, git and the Go control-plane sources out.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p nodeipam-controller --bin nodeipam \
    && install -D -m 0755 target/release/nodeipam /out/nodeipam

# glibc-linked (ring and rustls need no OpenSSL): the distroless "cc" base provides libc and
# libgcc; nothing else.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /out/nodeipam /usr/local/bin/nodeipam
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/nodeipam"]
CMD ["run"]
