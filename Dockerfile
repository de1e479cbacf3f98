# syntax=docker/dockerfile:1
# Multi-stage build: a cached dependency layer, then the service; the runtime
# image is Debian slim with the one binary, run as a non-root user.

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
# Dependencies first, against stub sources: this layer is rebuilt only when
# Cargo.toml or Cargo.lock change. Cargo reads every target the manifest
# declares before building any, so each gets a stub: the library, the binary
# and the `history` bench (examples and tests are discovered, not declared).
# crates/ holds a path dependency (the token counter): built here as the
# other dependencies are.
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
RUN mkdir -p src benches \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && echo 'fn main() {}' > benches/history.rs \
    && cargo build --release --locked --bin turnstore \
    && rm -rf src benches
# The sources, what they compile in (src/store/redis/layout.rs includes
# migrations/*.lua), and the bench the manifest declares (not built, but cargo
# wants its file).
COPY src ./src
COPY migrations ./migrations
# The lens page's files, built into the binary (src/http/lens.rs).
COPY lens/index.html lens/lens.js lens/lens.css lens/redact.js ./lens/
COPY benches ./benches
# Make cargo see the real sources as newer than the stub build.
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --bin turnstore

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin turnstore
COPY --from=build /src/target/release/turnstore /usr/local/bin/turnstore
USER 10001:10001
ENV TURNSTORE_LISTEN=0.0.0.0:8080 \
    TURNSTORE_LOG_FORMAT=json
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/turnstore", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/turnstore"]
CMD ["serve"]
