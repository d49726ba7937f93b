# amble: the server (and the load tester) in a small Debian image.
#   docker build -t amble .
#   docker run --rm -p 3000:3000 amble
#   docker run --rm -p 3001:3000 -e AMBLE_NATS=nats://HOST:4222 -e AMBLE_NODE_NAME=amble-2 amble
#                                       # a cluster node (docker-compose.yml runs two)
#
# Dependencies are built in a layer of their own (cargo-chef): editing a source
# file rebuilds only amble and loadtest, not every crate they use.
FROM rust:1.95-bookworm AS chef
RUN cargo install cargo-chef --locked --version 0.1.76
WORKDIR /src

# The recipe: every Cargo.toml and Cargo.lock, with no source code, so its
# layer changes only when dependencies do.
FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS build
COPY --from=planner /src/recipe.json recipe.json
RUN cargo chef cook --release --locked --recipe-path recipe.json --bin amble --bin loadtest
COPY . .
RUN cargo build --release --locked --bin amble --bin loadtest

FROM debian:bookworm-slim
COPY --from=build /src/target/release/amble /usr/local/bin/amble
COPY --from=build /src/target/release/loadtest /usr/local/bin/loadtest
# Inside a container, listen on every interface; publish the port to choose who can reach it.
ENV AMBLE_LISTEN=0.0.0.0:3000 \
    RUST_LOG=info
EXPOSE 3000
USER nobody
# Docker stops containers with SIGTERM: amble closes every socket with 1001 and exits.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/3000 && printf 'GET /healthz HTTP/1.0\\r\\n\\r\\n' >&3 && grep -q '^ok' <&3"]
ENTRYPOINT ["amble"]
