# On the host, before the L1 is built (scripts/kvm-lab.sh runs it with the
# folder whose files land in the L1's /lab, and the one for the guest's
# initramfs): the Firecracker Go SDK test
# (compat/firecracker-sdk) compiled into one static binary.
set -eu
out=$1
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
GO=$(command -v go || echo /usr/local/go/bin/go)
[ -x "$GO" ] || { echo "no go command (scripts/install-go.sh installs one)" >&2; exit 1; }
cd "$ROOT/compat/firecracker-sdk"
CGO_ENABLED=0 GOFLAGS=-mod=readonly "$GO" test -c -o "$out/sdk.test" .
