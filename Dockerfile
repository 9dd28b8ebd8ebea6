# kproxy's image: the static binary `make build` makes, on Debian with the
# tools kproxy runs (nftables, iptables with both backends, conntrack,
# ipset, kmod). /usr/local/bin/kube-proxy points at kproxy, so kubeadm's
# kube-proxy DaemonSet runs it with only its image changed.
#   docker build -t registry.example/kproxy:dev .
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The same binary as `make build` (bin/kproxy): ./cmd/kproxy, static.
RUN CGO_ENABLED=0 go build -trimpath -o /out/kproxy ./cmd/kproxy

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends nftables iptables conntrack ipset kmod \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/kproxy /usr/local/bin/kproxy
RUN ln -s kproxy /usr/local/bin/kube-proxy
ENTRYPOINT ["/usr/local/bin/kproxy"]
