#!/usr/bin/env bash
# Installs (or, with "delete", removes) Trellis from config/default with the operator — and
# so the node agent, which runs the operator's image unless spec.agent.image says otherwise —
# running IMAGE: the image you built and pushed (make docker-build docker-push IMG=...).
# A throwaway kustomize overlay names the image; the repository's files stay as they are.
#
#   hack/deploy.sh IMAGE [apply|delete|render]     (make deploy IMG=..., make undeploy)
#
# IMAGE is NAME[:TAG] or NAME@sha256:DIGEST. KUBECTL (default kubectl) is the kubectl to use.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
image="${1:-}"
action="${2:-apply}"
kubectl="${KUBECTL:-kubectl}"
if [[ -z "${image}" ]]; then
  echo "usage: hack/deploy.sh IMAGE [apply|delete|render] (IMAGE: NAME[:TAG] or NAME@sha256:DIGEST)" >&2
  exit 2
fi

# Split IMAGE as kustomize's images field wants it. A ':' after the last '/' is a tag (one
# before it is a registry's port).
name="${image}" tag="latest" digest=""
if [[ "${image}" == *@* ]]; then
  name="${image%%@*}" tag="" digest="${image#*@}"
elif [[ "${image##*/}" == *:* ]]; then
  name="${image%:*}" tag="${image##*:}"
fi
if [[ -z "${name}" || ( "${image}" == *@* && "${digest}" != sha256:* ) ]]; then
  echo "hack/deploy.sh: IMAGE ${image@Q} is not NAME[:TAG] or NAME@sha256:DIGEST" >&2
  exit 2
fi

overlay="$(mktemp -d)"
trap 'rm -rf "${overlay}"' EXIT
{
  echo "apiVersion: kustomize.config.k8s.io/v1beta1"
  echo "kind: Kustomization"
  echo "resources:"
  # kustomize takes a relative path to a base outside the overlay, not an absolute one.
  echo "- $(realpath --relative-to="${overlay}" "${root}/config/default")"
  echo "images:"
  # config/manager names the image ghcr.io/trellis-net/trellis (its kustomization's newName).
  echo "- name: ghcr.io/trellis-net/trellis"
  echo "  newName: ${name}"
  [[ -n "${tag}" ]] && echo "  newTag: ${tag}"
  [[ -n "${digest}" ]] && echo "  digest: ${digest}"
  # The agent's image (RELATED_IMAGE_AGENT) follows the operator's, as in config/manager.
  cat <<'YAML'
replacements:
- source:
    kind: Deployment
    name: trellis-operator
    fieldPath: spec.template.spec.containers.[name=manager].image
  targets:
  - select:
      kind: Deployment
      name: trellis-operator
    fieldPaths:
    - spec.template.spec.containers.[name=manager].env.[name=RELATED_IMAGE_AGENT].value
YAML
} >"${overlay}/kustomization.yaml"

case "${action}" in
  apply) "${kubectl}" apply -k "${overlay}" ;;
  delete) "${kubectl}" delete -k "${overlay}" --ignore-not-found ;;
  render) "${kubectl}" kustomize "${overlay}" ;;
  *) echo "hack/deploy.sh: unknown action ${action@Q}: apply, delete or render" >&2; exit 2 ;;
esac
