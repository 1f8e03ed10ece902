#!/usr/bin/env bash
# Validates a krew plugin manifest and its archives with krew's own validator, the one
# krew-index runs on every plugin: validate-krew-manifest of sigs.k8s.io/krew (KREW_VERSION,
# built with krew by hack/build-krew.sh). It checks the structure (apiVersion, kind, the name
# matching the file name, a semver version, a one-line shortDescription, uri, sha256 and bin
# of each platform, selectors each matching a platform krew supports and no two the same
# one), then runs `kubectl krew install --manifest` for every platform (KREW_OS, KREW_ARCH)
# into a scratch KREW_ROOT, which checks each archive against its sha256, that it holds bin
# and every file the manifest copies, and that a LICENSE is installed.
#
#   hack/validate-krew-manifest.sh DIST/trellis.yaml
#
# The archives are in DIST beside the manifest, not yet at the release URLs its uris name:
# the kubectl the validator runs is a shim that runs krew with --archive DIST/<the
# archive named *_<os>_<arch>.*> (krew still checks its sha256 against the manifest).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $# -eq 1 && -f "$1" ]] || { log "usage: $0 MANIFEST.yaml (the archives beside it)"; exit 2; }
manifest="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
dist="$(dirname "${manifest}")"
bin="$(hack/build-krew.sh)"

shim="$(mktemp -d)"
trap 'rm -rf "${shim}"' EXIT
# The validator runs `kubectl krew install --manifest FILE -v=4` with KREW_ROOT, KREW_OS,
# KREW_ARCH and PATH only.
cat > "${shim}/kubectl" <<SHIM
#!/usr/bin/env bash
set -euo pipefail
[[ "\${1:-}" == krew ]] || { echo "kubectl (validate-krew-manifest.sh's shim): only 'kubectl krew' is supported" >&2; exit 2; }
shift
shopt -s nullglob
archives=("${dist}"/*_"\${KREW_OS}"_"\${KREW_ARCH}".*)
[[ \${#archives[@]} -eq 1 ]] || { echo "want one archive for \${KREW_OS}/\${KREW_ARCH} in ${dist}, found \${#archives[@]}" >&2; exit 1; }
KREW_NO_UPGRADE_CHECK=1 exec "${bin}/krew" "\$@" --archive "\${archives[0]}"
SHIM
chmod +x "${shim}/kubectl"
log "validating ${manifest}"
PATH="${shim}:${PATH}" "${bin}/validate-krew-manifest" -manifest "${manifest}"
