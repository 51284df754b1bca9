// Package bootstrapper is the daemon every new node starts
// (gatehouse-bootstrapper): it runs the InitServer and the JoinClient in
// parallel until one of them takes the node lock, then re-keys the state
// disk, installs the Kubernetes components and runs kubeadm, and exits.
// docs/bootstrapper.md has the state machine and the failure policy.
package bootstrapper

import (
	"context"
	"encoding/pem"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/atomicfile"
	"github.com/gatehouse-dev/gatehouse/internal/bootstrapstatus"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	"github.com/gatehouse-dev/gatehouse/internal/kmsplugin"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
)

// Files the bootstrapper writes, relative to the node's root.
const (
	// kubeadmDir holds the generated kubeadm configuration and patches.
	kubeadmDir = "/etc/gatehouse/kubeadm"
	// KubeadmPatchesDir holds the node's own kubeadm patches (its kubelet
	// configuration over the cluster's), written at join and kept: kubeadm
	// upgrade needs them again, or the node's kubelet would take the
	// cluster's settings (the init node's) as its own.
	KubeadmPatchesDir = kubeadmDir + "/patches"
)

// stateDisk is the part of the state disk a bootstrap changes.
type stateDisk interface {
	UUID(ctx context.Context) (string, error)
	Rekey(ctx context.Context, oldKey, newKey []byte) error
	MarkInitialised(ctx context.Context, measurementSalt []byte) error
	MarkForReset(ctx context.Context) error
}

// componentInstaller installs pinned components; *installer.Installer.
type componentInstaller interface {
	Install(ctx context.Context, components []*componentsv1.Component) error
}

// KubeadmRunner runs kubeadm with args and returns its combined output.
// ExecKubeadm runs the real binary.
type KubeadmRunner interface {
	Run(ctx context.Context, args ...string) ([]byte, error)
}

// Machine is the node's machine as init and join change it after the node
// lock: its file system, state disk, component installer, kubeadm and the
// node's identity for kubeadm.
type Machine struct {
	// Root is the file system root files are written under: "/" on a node,
	// a temporary directory in tests.
	Root string
	// Disk is the state disk, formatted at first boot with FirstBootKey.
	Disk         stateDisk
	FirstBootKey []byte
	// State, when set, puts the node's state on the state disk once its
	// key is known (a *statedisk.Volume). Nil where the kernel has no
	// device-mapper: the key is then only proven (TestKey).
	State     stateVolume
	Installer componentInstaller
	Kubeadm   KubeadmRunner
	// Node and Kubelet describe the node to kubeadm.
	Node    kubeadm.Node
	Kubelet kubeadm.KubeletOptions
	Log     *slog.Logger
	// KubeletLogs returns the kubelet's recent log for failure reports;
	// nil reports none. JournalKubeletLogs reads systemd's journal.
	KubeletLogs func(ctx context.Context) ([]byte, error)
	// ContainerdHostsDir is containerd's config_path on the node, where
	// an ImageMirror's hosts.toml files go (writeImageMirror); ""
	// is DefaultContainerdHostsDir.
	ContainerdHostsDir string
}

// JournalKubeletLogs returns the last 200 lines of kubelet.service's log.
func JournalKubeletLogs(ctx context.Context) ([]byte, error) {
	return runCommand(ctx, "journalctl", "--unit", "kubelet.service", "--lines", "200", "--no-pager", "--output", "short-iso")
}

// path returns p (absolute on the node) under Root.
func (s *Machine) path(p string) string { return filepath.Join(s.Root, p) }

// writeFile writes data to p under Root with mode, atomically: readers see
// the old file or the whole new one.
func (s *Machine) writeFile(p string, data []byte, mode fs.FileMode) error {
	full := s.path(p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil { //nolint:gosec // /etc/kubernetes and friends are world-readable directories
		return fmt.Errorf("writing %s: %w", p, err)
	}
	return atomicfile.Write(full, data, mode)
}

// writeServingCert puts the kubelet serving certificate certDER with its
// key in the kubelet's serving certificate store; the kubelet serves with
// it and renews it through CSRs.
func (s *Machine) writeServingCert(certDER, keyPEM []byte, now time.Time) error {
	return s.writeKubeletPair(kubeadm.KubeletServingPrefix, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: certDER}), keyPEM, now)
}

// writeKubeletPair puts a certificate and key (PEM) in the kubelet's
// certificate store of prefix as the kubelet's own renewals do (client-go's
// certificate file store): a PEM file of both, named after now, and the
// <prefix>-current.pem link to it, replaced atomically.
func (s *Machine) writeKubeletPair(prefix string, certPEM, keyPEM []byte, now time.Time) error {
	name := prefix + "-" + now.UTC().Format("2006-01-02-15-04-05") + ".pem"
	if err := s.writeFile(kubeadm.KubeletPKIDir+"/"+name, append(slices.Clone(certPEM), keyPEM...), 0o600); err != nil {
		return err
	}
	current := s.path(kubeadm.KubeletPKIDir + "/" + prefix + "-current.pem")
	tmp := current + ".tmp"
	_ = os.Remove(tmp)
	// Relative: the link resolves the same under Root and on the node.
	if err := os.Symlink(name, tmp); err != nil {
		return fmt.Errorf("linking the kubelet's %s certificate: %w", prefix, err)
	}
	if err := os.Rename(tmp, current); err != nil {
		return fmt.Errorf("linking the kubelet's %s certificate: %w", prefix, err)
	}
	return nil
}

// writeAuditPolicy writes the API server's audit policy, which the
// cluster's kube-apiserver configuration mounts on every control plane
// (kubeadm.AuditPolicyPath).
func (s *Machine) writeAuditPolicy() error {
	policy, err := kubeadm.AuditPolicy()
	if err != nil {
		return err
	}
	return s.writeFile(kubeadm.AuditPolicyPath, policy, 0o600)
}

// EtcdKEKFile is where a control plane keeps the KMS v2 plugin's
// key-encryption keys (kmsplugin.MarshalKEKs, mode 0600), on its state
// disk; `gatehouse-bootstrapper serve-kms` serves the plugin from it.
const EtcdKEKFile = "/etc/kubernetes/gatehouse/etcd-encryption-keys.json"

// writeSecretsEncryption writes the KMS v2 plugin's KEKs and the API
// server's EncryptionConfiguration naming the plugin's socket, which the
// cluster's kube-apiserver configuration mounts on every control plane
// (kubeadm.InitParams.EncryptSecrets).
func (s *Machine) writeSecretsEncryption(keks kmsplugin.KEKs) error {
	data, err := kmsplugin.MarshalKEKs(keks)
	if err != nil {
		return fmt.Errorf("KMS v2 key-encryption keys: %w", err)
	}
	if err := s.writeFile(EtcdKEKFile, data, 0o600); err != nil {
		return err
	}
	config, err := kubeadm.EncryptionConfiguration(kubeadm.KMSPluginSocket)
	if err != nil {
		return err
	}
	return s.writeFile(kubeadm.EncryptionConfigPath, config, 0o600)
}

// rekeyDisk replaces the first-boot passphrase with diskKey, records the
// measurement salt and puts the node's state on the disk. Re-running it
// after an interruption is safe.
func (s *Machine) rekeyDisk(ctx context.Context, diskKey, measurementSalt []byte) error {
	if err := s.Disk.Rekey(ctx, s.FirstBootKey, diskKey); err != nil {
		return err
	}
	if err := s.Disk.MarkInitialised(ctx, measurementSalt); err != nil {
		return err
	}
	return s.unlockState(ctx, diskKey)
}

// unlockState puts the node's state on the state disk opened with key,
// where the kernel can open it (State is set).
func (s *Machine) unlockState(ctx context.Context, key []byte) error {
	if s.State == nil {
		return nil
	}
	if err := s.State.Unlock(ctx, key); err != nil {
		return fmt.Errorf("putting the node's state on the state disk: %w", err)
	}
	return nil
}

// syncState writes the node's state through to its state disk before a
// bootstrap counts as done: file systems write file data late (ext4's
// delayed allocation), and a power cut seconds after a join left the
// state disk with a zero-length /etc/kubernetes/pki/ca.crt (seen on a VM
// reset). Without a state disk (State nil) there is nothing to sync.
func (s *Machine) syncState() error {
	if s.State == nil {
		return nil
	}
	if err := s.State.Sync(); err != nil {
		return fmt.Errorf("writing the node's state through to its state disk: %w", err)
	}
	return nil
}

// markFailed records a failure after the node lock: the state disk is
// marked for reset, the status says failed with err. It returns err as a
// *FailedError.
func (s *Machine) markFailed(err error, now time.Time) *FailedError {
	s.Log.Error("Bootstrap failed after the node lock; marking the state disk for reset", "error", err.Error())
	if rerr := s.Disk.MarkForReset(context.Background()); rerr != nil {
		s.Log.Error("Marking the state disk for reset failed", "error", rerr.Error())
	}
	failed := &FailedError{Err: err}
	s.recordStatus(bootstrapstatus.PhaseFailed, failed, now)
	return failed
}

// ExecKubeadm runs the kubeadm binary at Path (found in PATH when empty).
type ExecKubeadm struct {
	Path string
}

// Run runs kubeadm with args.
func (r ExecKubeadm) Run(ctx context.Context, args ...string) ([]byte, error) {
	bin := r.Path
	if bin == "" {
		bin = "kubeadm"
	}
	return runCommand(ctx, bin, args...)
}
