#!/usr/bin/env bash
# Builds the tests' Vault server from its pinned Go module: a real Vault core
# (github.com/hashicorp/vault v1.21.2, BUSL-1.1, run by tests only, never
# linked into Gatehouse) with only the Transit secrets engine, in memory,
# serving Vault's HTTP API on loopback (hack/tools/vaultdev/main.go). The
# module replaces go-discover (Raft cloud auto-join, unused in memory) with a
# stub of no providers, which halves the build. Cached outside the repository,
# keyed by the module's content; a second run is a no-op.
#
# Why v1.21.2: v1.21.4 (the newest listed) needs a Vault SDK that no published
# version provides; OpenBao's modules are not served here (docs/keys.md).
#
# Usage: hack/vault-binary.sh    build if needed, print the binary's path
# Env:   GATEHOUSE_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/gatehouse)
set -euo pipefail

VAULT_VERSION=v1.21.2

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/progress.sh
source "$here/lib/progress.sh"
# shellcheck source=lib/cache.sh
source "$here/lib/cache.sh"
src="$here/tools/vaultdev"
cache_root=${GATEHOUSE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gatehouse}
dir="$cache_root/vault/$VAULT_VERSION-$(cache_key "$src")"

log() { printf '[vault-binary] %s\n' "$*" >&2; }

cache_enter vault-binary "$dir" "$dir/vaultdev"
tmp=$cache_tmp

got=$(cd "$src" && go list -m -f '{{.Version}}' github.com/hashicorp/vault)
[[ "$got" == "$VAULT_VERSION" ]] || { log "hack/tools/vaultdev/go.mod requires Vault $got, want $VAULT_VERSION"; exit 1; }
log "building the tests' Vault server (Vault $VAULT_VERSION, Transit only) into $dir, once (cold: about 3 min on 2 quiet cores)"
cd "$src"
export CGO_ENABLED=0
progress_run vault-binary "downloading Vault's modules" 0 go mod download
total=$(go list -deps . | wc -l)
progress_run vault-binary "compiling vaultdev" "$total" go build -v -trimpath -buildvcs=false -ldflags "-s -w" -o "$tmp/vaultdev" .
cache_commit vault-binary "$dir" "$dir/vaultdev"
