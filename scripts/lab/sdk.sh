# The Firecracker Go SDK (v1.0.0, its own test compiled by sdk.prep.sh)
# boots a Linux guest under `hover firecracker` with a root drive, and one
# with a balloon it inflates and deflates through Firecracker's balloon API
# (crates/hover/tests/firecracker_sdk.rs asserts the marks). TCG is slow: the SDK's
# request and start timeouts are raised.
. /lab/lib.sh
export HOVER_BIN=/bin/hover HOVER_LINUX_KERNEL=/lab/vmlinuz HOVER_LINUX_INITRD=/lab/initrd
export FIRECRACKER_GO_SDK_INIT_TIMEOUT_SECONDS=120 FIRECRACKER_GO_SDK_REQUEST_TIMEOUT_MILLISECONDS=120000
export TMPDIR=/tmp HOME=/root
timeout 800 /lab/sdk.test -test.v -test.count=1 -test.run 'TestLinuxGuestWithARootDrive|TestLinuxGuestBalloonThroughTheSDK' > /tmp/sdk.out 2>&1
echo "LAB: sdk test exit $?"
sed 's/^/LAB: sdk: /' /tmp/sdk.out | grep -a -e "--- " -e "GUEST:" -e "Error\|error" | head -40
check sdk-boots-linux-with-a-root-drive grep -q -- "--- PASS: TestLinuxGuestWithARootDrive" /tmp/sdk.out
check sdk-balloon-inflates-and-deflates grep -q -- "--- PASS: TestLinuxGuestBalloonThroughTheSDK" /tmp/sdk.out
[ $FAILED = 0 ] || tail -60 /tmp/sdk.out
exit $FAILED
