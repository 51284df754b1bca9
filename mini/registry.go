package mini

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The local image registry is the CNCF distribution registry, built from
// its pinned module (hack/addon-binaries.sh), at the cluster network's
// RegistryAddress (the host's address on the cluster bridge), over plain
// HTTP. Every node's containerd pulls from it; `gatehouse mini load`
// pushes to it.

// registryConfig is the registry's configuration: storage under dir.
const registryConfig = `version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
`

// startRegistry starts the registry binary (of addonBin) for the cluster of
// rec and waits until it answers, recording its PID.
func startRegistry(ctx context.Context, rec *Record, addonBin string) error {
	address := rec.Network.RegistryAddress()
	storage := filepath.Join(rec.Dir, "registry")
	if err := os.MkdirAll(storage, 0o700); err != nil {
		return err
	}
	cfg := filepath.Join(rec.Dir, "registry.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, registryConfig, storage, address), 0o600); err != nil {
		return err
	}
	client := &http.Client{Timeout: time.Second}
	return startHostProcess(ctx, rec, &rec.RegistryPID, "registry", "answer at "+address,
		[]string{filepath.Join(addonBin, "registry"), "serve", cfg}, func() (bool, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+address+"/v2/", nil)
			if err != nil {
				return false, err
			}
			resp, err := client.Do(req)
			if err != nil {
				return false, nil
			}
			_ = resp.Body.Close()
			return resp.StatusCode == http.StatusOK, nil
		})
}

// startHostProcess starts argv on the host in its own session, logging to
// <name>.log in the cluster directory, records its PID in *pid (saved in
// rec, so mini down stops it), and polls ready until it is ready, it
// exits, or 20 s pass.
func startHostProcess(ctx context.Context, rec *Record, pid *int, name, readiness string, argv []string, ready func() (bool, error)) error {
	logFile, err := os.OpenFile(filepath.Join(rec.Dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644) //nolint:gosec // no secrets
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	*pid = cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if err := rec.save(); err != nil {
		return err
	}
	return poll(ctx, 50*time.Millisecond, 20*time.Second, name+" to "+readiness, func() (bool, error) {
		select {
		case err := <-exited:
			return false, fmt.Errorf("%s exited (%w); its log is %s", name, err, logFile.Name())
		default:
		}
		return ready()
	})
}

// stopProcess stops a recorded process of the cluster (the load balancer,
// the registry): SIGTERM, then SIGKILL after timeout.
func stopProcess(ctx context.Context, what string, pid int) error {
	if pid <= 0 {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stopping %s: %w", what, err)
	}
	waitGone(ctx, pid, 10*time.Second)
	return nil
}

// Load pushes every image of the archive at path (as `docker save` or
// `gatehouse`'s image builder writes: a tarball with manifest.json) into
// the local cluster's registry, keeping each image's repository and tag,
// and returns the references pods use. A cluster must run from dir.
func Load(ctx context.Context, dir, path string, out io.Writer) ([]string, error) {
	rec, err := ReadRecord(dir)
	if err != nil {
		return nil, fmt.Errorf("no local cluster in %s: %w", dir, err)
	}
	if rec.RegistryPID <= 0 || syscall.Kill(rec.RegistryPID, 0) != nil {
		return nil, fmt.Errorf("the local cluster in %s runs no registry: start it with `gatehouse mini up`", dir)
	}
	opener := func() (io.ReadCloser, error) { return os.Open(path) }
	manifest, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, fmt.Errorf("%s is not an image archive (docker save writes one): %w", path, err)
	}
	var refs []string
	for _, desc := range manifest {
		if len(desc.RepoTags) == 0 {
			return nil, fmt.Errorf("%s holds an image without a name: save it by NAME:TAG", path)
		}
		for _, t := range desc.RepoTags {
			tag, err := name.NewTag(t)
			if err != nil {
				return nil, fmt.Errorf("%s: image name %q: %w", path, t, err)
			}
			img, err := tarball.Image(opener, &tag)
			if err != nil {
				return nil, fmt.Errorf("%s: image %s: %w", path, t, err)
			}
			dst, err := name.NewTag(rec.Network.RegistryAddress()+"/"+tag.RepositoryStr()+":"+tag.TagStr(), name.Insecure)
			if err != nil {
				return nil, err
			}
			if err := push(ctx, dst, img); err != nil {
				return nil, err
			}
			fmt.Fprintf(out, "Loaded %s\n", dst)
			refs = append(refs, dst.String())
		}
	}
	return refs, nil
}

func push(ctx context.Context, dst name.Tag, img v1.Image) error {
	if err := remote.Write(dst, img, remote.WithContext(ctx)); err != nil {
		return fmt.Errorf("pushing %s: %w", dst, err)
	}
	return nil
}
