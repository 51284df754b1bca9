#!/usr/bin/env bash
# Installs the pinned Go development tools into a cache directory outside the
# repository and prints that directory. Each tool is reinstalled only when its
# pinned version changes.
#
# Env: GATEHOUSE_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/gatehouse)
set -euo pipefail

# package@version, one per tool. Bump here and only here.
TOOLS=(
	github.com/bufbuild/buf/cmd/buf@v1.70.0
	google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
	github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0
	gotest.tools/gotestsum@v1.13.0
	sigs.k8s.io/controller-tools/cmd/controller-gen@v0.20.0
	# MinIO server (AGPL, run by tests only, never linked): the S3 store of capi/userdatastore's tests.
	github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c
)

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/progress.sh
source "$here/lib/progress.sh"
cache_root=${GATEHOUSE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gatehouse}
bin="$cache_root/tools/bin"
mkdir -p "$bin"
for tool in "${TOOLS[@]}"; do
	name=${tool%@*}
	name=${name##*/}
	stamp="$bin/.$name@${tool#*@}"
	if [[ -f "$stamp" && -x "$bin/$name" ]]; then
		continue
	fi
	progress_run go-tools "installing $tool" -1 env GOBIN="$bin" go install -v "$tool"
	rm -f "$bin/.$name@"*
	touch "$stamp"
done
echo "$bin"
