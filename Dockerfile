# One image for the operator, the node agent and the CNI plugin (the agent copies the
# plugin onto the node). Build: make docker-build (needs a Docker engine).
FROM golang:1.26 AS build
# make docker-build passes TRELLIS_VERSION of hack/versions.env.
ARG VERSION=v0.0.0-dev
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-X github.com/trellis-net/trellis/internal/version.Version=${VERSION}" \
      -o /out/ ./cmd/manager ./cmd/agent ./cmd/cni \
 && mv /out/manager /out/trellis-operator && mv /out/agent /out/trellis-agent && mv /out/cni /out/trellis
# The reference plugins the agent installs beside trellis: portmap (hostPort) and loopback,
# of the release the tests run (CNI_PLUGINS_VERSION in hack/versions.env).
RUN . hack/versions.env && CGO_ENABLED=0 GOBIN=/out/cni go install -trimpath \
      "github.com/containernetworking/plugins/plugins/meta/portmap@${CNI_PLUGINS_VERSION}" \
      "github.com/containernetworking/plugins/plugins/main/loopback@${CNI_PLUGINS_VERSION}"

FROM debian:bookworm-slim
# iptables/ipset userspace for the agent's masquerade and NetworkPolicy rules.
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables ipset iproute2 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/trellis-operator /out/trellis-agent /out/trellis /usr/local/bin/
COPY --from=build /out/cni/ /usr/local/lib/trellis/cni/
# The operator runs as this user (see config/manager); the agent's DaemonSet runs it as
# root, unprivileged, with every capability dropped but NET_ADMIN and NET_RAW (config/agent).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/trellis-operator"]
