// Package sdk drives `hover firecracker` through the real Firecracker Go
// SDK (firecracker-go-sdk v1.0.0): a client nobody at Hover wrote.
//
// HOVER_BIN names the hover binary (crates/hover/tests/firecracker_sdk.rs
// sets it); the SDK execs it through a symlink named `firecracker`, as
// tools that exec that name do.
package sdk

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	firecracker "github.com/firecracker-microvm/firecracker-go-sdk"
	models "github.com/firecracker-microvm/firecracker-go-sdk/client/models"
)

// vmm is one `firecracker` process the SDK runs, with its output.
type vmm struct {
	machine *firecracker.Machine
	socket  string
	stdout  *bytes.Buffer
	stderr  *bytes.Buffer
}

// setup returns a scratch directory holding the built-in guest image and
// a `firecracker` symlink to hover.
func setup(t *testing.T) (dir, image, bin string) {
	t.Helper()
	hover := os.Getenv("HOVER_BIN")
	if hover == "" {
		t.Fatal("HOVER_BIN is not set: run this through `cargo test --test firecracker_sdk`")
	}
	dir = t.TempDir()
	image = filepath.Join(dir, "guest.elf")
	if out, err := exec.Command(hover, "guest-image", "--out", image).CombinedOutput(); err != nil {
		t.Fatalf("hover guest-image: %v: %s", err, out)
	}
	bin = filepath.Join(dir, "firecracker")
	if err := os.Symlink(hover, bin); err != nil {
		t.Fatal(err)
	}
	return dir, image, bin
}

// start runs a `firecracker` process under the SDK with cfg and opts.
func start(t *testing.T, bin, name string, cfg firecracker.Config, opts ...firecracker.Opt) (*vmm, error) {
	t.Helper()
	v := &vmm{socket: cfg.SocketPath, stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}
	cmd := firecracker.VMCommandBuilder{}.
		WithBin(bin).
		WithSocketPath(cfg.SocketPath).
		AddArgs("--id", name).
		WithStdout(v.stdout).
		WithStderr(v.stderr).
		Build(context.Background())
	opts = append(opts, firecracker.WithProcessRunner(cmd))
	m, err := firecracker.NewMachine(context.Background(), cfg, opts...)
	if err != nil {
		t.Fatalf("%s: NewMachine: %v", name, err)
	}
	v.machine = m
	return v, m.Start(context.Background())
}

// wait waits (at most a minute) for the process to end: the SDK's error.
func (v *vmm) wait(t *testing.T) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := v.machine.Wait(ctx)
	if ctx.Err() != nil {
		t.Fatalf("the VMM did not end within a minute; stderr: %s", v.stderr)
	}
	return err
}

func state(t *testing.T, v *vmm) string {
	t.Helper()
	info, err := v.machine.DescribeInstanceInfo(context.Background())
	if err != nil {
		t.Fatalf("DescribeInstanceInfo: %v", err)
	}
	return firecracker.StringValue(info.State)
}

func config(dir, name, image, args string) firecracker.Config {
	return firecracker.Config{
		SocketPath:      filepath.Join(dir, name+".sock"),
		KernelImagePath: image,
		KernelArgs:      args,
		LogPath:         filepath.Join(dir, name+".log"),
		LogLevel:        "Info",
		MetricsPath:     filepath.Join(dir, name+".metrics"),
		MachineCfg: models.MachineConfiguration{
			VcpuCount:  firecracker.Int64(2),
			MemSizeMib: firecracker.Int64(128),
		},
	}
}

// A guest started, paused, snapshotted and resumed through the SDK runs to
// its verified end; a new process loads the snapshot and runs the guest on
// to its verified end as well.
func TestStartSnapshotResumeAndLoad(t *testing.T) {
	dir, image, bin := setup(t)
	cfg := config(dir, "first", image, "workload=kvstore wss=8M rate=2000 seconds=8")
	v, err := start(t, bin, "first", cfg)
	if err != nil {
		t.Fatalf("Start: %v; stderr: %s", err, v.stderr)
	}
	if s := state(t, v); s != "Running" {
		t.Fatalf("state after Start: %q, want Running", s)
	}
	ctx := context.Background()
	if err := v.machine.PauseVM(ctx); err != nil {
		t.Fatalf("PauseVM: %v", err)
	}
	if s := state(t, v); s != "Paused" {
		t.Fatalf("state after PauseVM: %q, want Paused", s)
	}
	mem, snap := filepath.Join(dir, "vm.mem"), filepath.Join(dir, "vm.snap")
	if err := v.machine.CreateSnapshot(ctx, mem, snap); err != nil {
		t.Fatalf("CreateSnapshot: %v", err)
	}
	if err := v.machine.ResumeVM(ctx); err != nil {
		t.Fatalf("ResumeVM: %v", err)
	}
	if err := v.wait(t); err != nil {
		t.Fatalf("Wait: %v (the guest's exit is the process's); stderr: %s", err, v.stderr)
	}
	if !strings.Contains(v.stdout.String(), "guest exited with code 0") {
		t.Fatalf("no clean guest exit in stdout: %s", v.stdout)
	}
	if _, err := os.Stat(cfg.SocketPath); !os.IsNotExist(err) {
		t.Fatalf("the API socket outlived the VMM: %v", err)
	}

	loaded := config(dir, "second", "", "")
	w, err := start(t, bin, "second", loaded, firecracker.WithSnapshot(mem, snap, func(c *firecracker.SnapshotConfig) {
		c.ResumeVM = true
	}))
	if err != nil {
		t.Fatalf("Start from the snapshot: %v; stderr: %s", err, w.stderr)
	}
	if err := w.wait(t); err != nil {
		t.Fatalf("Wait (restored): %v; stderr: %s", err, w.stderr)
	}
	out := w.stdout.String()
	if !strings.Contains(out, "guest exited with code 0") || !strings.Contains(out, "restored from") {
		t.Fatalf("the restored guest did not run to a clean exit: %s", out)
	}
	if m, err := os.ReadFile(cfg.MetricsPath); err != nil || !bytes.Contains(m, []byte(`"vcpu"`)) {
		t.Fatalf("no metrics line in %s: %v %q", cfg.MetricsPath, err, m)
	}
}

// A drive on Hover's own guest (which has no virtio drivers) is refused
// with Hover's reason, not a hang; StopVMM (SIGTERM) then ends the process.
func TestADriveOnHoversOwnGuestIsRefused(t *testing.T) {
	dir, image, bin := setup(t)
	cfg := config(dir, "drive", image, "workload=hello")
	cfg.Drives = []models.Drive{{
		DriveID:      firecracker.String("rootfs"),
		PathOnHost:   firecracker.String(image),
		IsRootDevice: firecracker.Bool(true),
		IsReadOnly:   firecracker.Bool(true),
	}}
	v, err := start(t, bin, "drive", cfg)
	if err == nil {
		t.Fatal("Start with a drive succeeded")
	}
	if !strings.Contains(err.Error(), "need a Linux guest") {
		t.Fatalf("Start's error does not say why: %v", err)
	}
	if err := v.machine.StopVMM(); err != nil {
		t.Fatalf("StopVMM: %v", err)
	}
	if err := v.wait(t); err == nil || !strings.Contains(err.Error(), "143") {
		t.Fatalf("Wait after StopVMM: %v, want exit status 143; stderr: %s", err, v.stderr)
	}
}

// StopVMM ends a running guest: the outcome is printed (ended by SIGTERM)
// and the socket removed.
func TestStopVMMEndsARunningVM(t *testing.T) {
	dir, image, bin := setup(t)
	cfg := config(dir, "stop", image, "workload=spin tasks=2 seconds=120")
	v, err := start(t, bin, "stop", cfg)
	if err != nil {
		t.Fatalf("Start: %v; stderr: %s", err, v.stderr)
	}
	if s := state(t, v); s != "Running" {
		t.Fatalf("state after Start: %q", s)
	}
	if err := v.machine.StopVMM(); err != nil {
		t.Fatalf("StopVMM: %v", err)
	}
	if err := v.wait(t); err == nil || !strings.Contains(err.Error(), "143") {
		t.Fatalf("Wait after StopVMM: %v, want exit status 143", err)
	}
	if !strings.Contains(v.stdout.String(), "ended by SIGTERM") {
		t.Fatalf("no outcome in stdout: %s", v.stdout)
	}
	if _, err := os.Stat(cfg.SocketPath); !os.IsNotExist(err) {
		t.Fatalf("the API socket outlived the VMM: %v", err)
	}
}

// A Linux kernel with an initramfs and a root drive, booted through the
// SDK: the guest reads the drive and writes to it, its console reaches
// the process's stdout, and its power-off ends the VMM with exit 0. It
// needs hardware KVM, so it runs in the KVM lab (scripts/lab/sdk.sh sets
// HOVER_LINUX_KERNEL and HOVER_LINUX_INITRD) and is skipped elsewhere.
func TestLinuxGuestWithARootDrive(t *testing.T) {
	kernel, initrd := os.Getenv("HOVER_LINUX_KERNEL"), os.Getenv("HOVER_LINUX_INITRD")
	if kernel == "" || initrd == "" {
		t.Skip("HOVER_LINUX_KERNEL and HOVER_LINUX_INITRD are not set: this test runs in the KVM lab (scripts/kvm-lab.sh run sdk)")
	}
	dir, _, bin := setup(t)
	root := filepath.Join(dir, "root.img")
	disk := make([]byte, 1<<20)
	copy(disk[4096:], "SDKROOTDISK")
	if err := os.WriteFile(root, disk, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := firecracker.Config{
		SocketPath:      filepath.Join(dir, "linux.sock"),
		KernelImagePath: kernel,
		InitrdPath:      initrd,
		KernelArgs:      "console=ttyS0 reboot=k panic=-1 lab.sdk=1",
		Drives: []models.Drive{{
			DriveID:      firecracker.String("rootfs"),
			PathOnHost:   firecracker.String(root),
			IsRootDevice: firecracker.Bool(true),
			IsReadOnly:   firecracker.Bool(false),
		}},
		MachineCfg: models.MachineConfiguration{
			VcpuCount:  firecracker.Int64(1),
			MemSizeMib: firecracker.Int64(256),
		},
	}
	v, err := start(t, bin, "linux", cfg)
	if err != nil {
		t.Fatalf("Start: %v; stderr: %s", err, v.stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := v.machine.Wait(ctx); err != nil {
		t.Fatalf("Wait: %v (want the guest's power-off, exit 0); stdout: %s; stderr: %s", err, v.stdout, v.stderr)
	}
	out := v.stdout.String()
	for _, want := range []string{"GUEST: up", "GUEST: root=/dev/vda rw", "GUEST: read SDKROOTDISK", "guest exited with code 0"} {
		if !strings.Contains(out, want) {
			t.Fatalf("%q not in the console and outcome: %s; stderr: %s", want, out, v.stderr)
		}
	}
	written, err := os.ReadFile(root)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(written[8192:], []byte("GUESTWROTE")) {
		t.Fatalf("the guest's write is not in the drive's file: %q", written[8192:8202])
	}
}

// A Linux guest with a balloon, steered through the SDK: created before
// the start (CreateBalloon in the SDK's init handlers, statistics every
// second), inflated to 32 MiB (UpdateBalloon; the guest's actual_mib,
// from GetBalloonStats, follows), deflated to 0, the statistics interval
// changed (UpdateBalloonStats) and the configuration read back
// (GetBalloonConfig). Runs in the KVM lab (scripts/lab/sdk.sh), where the
// guest holds (lab.hold) while the test steers it.
func TestLinuxGuestBalloonThroughTheSDK(t *testing.T) {
	kernel, initrd := os.Getenv("HOVER_LINUX_KERNEL"), os.Getenv("HOVER_LINUX_INITRD")
	if kernel == "" || initrd == "" {
		t.Skip("HOVER_LINUX_KERNEL and HOVER_LINUX_INITRD are not set: this test runs in the KVM lab (scripts/kvm-lab.sh run sdk)")
	}
	dir, _, bin := setup(t)
	cfg := firecracker.Config{
		SocketPath:      filepath.Join(dir, "balloon.sock"),
		KernelImagePath: kernel,
		InitrdPath:      initrd,
		KernelArgs:      "console=ttyS0 reboot=k panic=-1 lab.hold=300",
		MachineCfg: models.MachineConfiguration{
			VcpuCount:  firecracker.Int64(1),
			MemSizeMib: firecracker.Int64(256),
		},
	}
	withBalloon := func(m *firecracker.Machine) {
		m.Handlers.FcInit = m.Handlers.FcInit.AppendAfter(
			firecracker.CreateMachineHandlerName,
			firecracker.NewCreateBalloonHandler(0, false, 1),
		)
	}
	v, err := start(t, bin, "balloon", cfg, withBalloon)
	if err != nil {
		t.Fatalf("Start: %v; stderr: %s", err, v.stderr)
	}
	defer func() { _ = v.machine.StopVMM() }()
	ctx := context.Background()
	// actualIs waits (at most 3 minutes: TCG) until the guest says it holds
	// mib, its statistics there (the guest's driver gives them once it runs).
	actualIs := func(mib int64) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Minute)
		for {
			s, err := v.machine.GetBalloonStats(ctx)
			if err == nil && s.ActualMib != nil && *s.ActualMib == mib && s.TotalMemory > 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the balloon never held %d MiB: %+v, %v; stderr: %s", mib, s, err, v.stderr)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	actualIs(0)
	if err := v.machine.UpdateBalloon(ctx, 32); err != nil {
		t.Fatalf("UpdateBalloon 32: %v", err)
	}
	actualIs(32)
	if err := v.machine.UpdateBalloon(ctx, 0); err != nil {
		t.Fatalf("UpdateBalloon 0: %v", err)
	}
	actualIs(0)
	if err := v.machine.UpdateBalloonStats(ctx, 2); err != nil {
		t.Fatalf("UpdateBalloonStats: %v", err)
	}
	b, err := v.machine.GetBalloonConfig(ctx)
	if err != nil {
		t.Fatalf("GetBalloonConfig: %v", err)
	}
	if firecracker.Int64Value(b.AmountMib) != 0 || b.StatsPollingIntervals != 2 {
		t.Fatalf("the balloon's configuration: %+v (want amount 0, interval 2)", b)
	}
}
