package testenv

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/minio/minio-go/v7/pkg/s3utils"
)

// MinIOBinEnv names the environment variable that may point at the minio
// server binary; by default it is the one hack/go-tools.sh installs.
const MinIOBinEnv = "GATEHOUSE_MINIO_BIN"

// MinIOOptions configures StartMinIO.
type MinIOOptions struct {
	// Bucket is created once the server is up. Empty means "gatehouse-test".
	Bucket string
	// SSE gives the server a static KMS key (MINIO_KMS_SECRET_KEY), which
	// MinIO needs to store objects with SSE-S3
	// (x-amz-server-side-encryption: AES256). Without it MinIO refuses
	// SSE-S3 requests.
	SSE bool
	// StartTimeout bounds the start and the bucket's creation. Zero means
	// one minute.
	StartTimeout time.Duration
}

// MinIO is a running MinIO server: one drive in a temporary directory,
// HTTPS on a free loopback port with a freshly generated CA, random root
// credentials.
type MinIO struct {
	// Endpoint is 127.0.0.1:<port>, without a scheme (the S3 API over HTTPS).
	Endpoint string
	// Bucket exists and is empty at start.
	Bucket string
	// AccessKeyID and SecretAccessKey are the root user's credentials.
	AccessKeyID, SecretAccessKey string
	// RootCAs trusts the server's certificate (and nothing else).
	RootCAs *x509.CertPool
	// CACertPEM and CACertPath are the CA certificate, PEM.
	CACertPEM  []byte
	CACertPath string
	// Dir holds the drive (data/), the certificates (certs/, pki/) and
	// minio.log.
	Dir string

	proc *process
}

// StartMinIO starts a MinIO server for the test, waits until it is live,
// creates the bucket, and registers a cleanup that stops it (SIGTERM to its
// process group, then SIGKILL) and logs its log tail when the test failed.
// It fails the test when the binary is missing (see MinIOBin) or the server
// does not start in time.
func StartMinIO(t testing.TB, opts MinIOOptions) *MinIO {
	t.Helper()
	bin, err := MinIOBin()
	if err != nil {
		t.Fatal(err)
	}
	if opts.Bucket == "" {
		opts.Bucket = "gatehouse-test"
	}
	if err := s3utils.CheckValidBucketNameStrict(opts.Bucket); err != nil {
		t.Fatalf("MinIOOptions.Bucket %q: %v", opts.Bucket, err)
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(t.Context(), opts.StartTimeout)
	defer cancel()

	m := &MinIO{Bucket: opts.Bucket, Dir: t.TempDir()}
	if err := m.writeCerts(); err != nil {
		t.Fatalf("starting MinIO: %v", err)
	}
	env, err := m.environment(opts.SSE)
	if err != nil {
		t.Fatalf("starting MinIO: %v", err)
	}
	t.Cleanup(func() {
		if m.proc == nil {
			return
		}
		if t.Failed() {
			t.Logf("minio log tail:\n%s", m.proc.logTail(4096))
		}
		m.proc.stop()
	})
	if err := m.start(ctx, bin, env); err != nil {
		t.Fatalf("starting MinIO: %v", err)
	}
	return m
}

// MinIOBin returns the minio server binary: $GATEHOUSE_MINIO_BIN, else
// $GATEHOUSE_CACHE/tools/bin/minio (GATEHOUSE_CACHE defaults to
// ${XDG_CACHE_HOME:-$HOME/.cache}/gatehouse, where hack/go-tools.sh
// installs it), else minio on PATH. The error says to run `make setup-test`.
func MinIOBin() (string, error) {
	if bin := os.Getenv(MinIOBinEnv); bin != "" {
		if !executable(bin) {
			return "", fmt.Errorf("%s=%s is not an executable file: unset it and run `make setup-test`, which installs the pinned MinIO", MinIOBinEnv, bin)
		}
		return bin, nil
	}
	cache := os.Getenv("GATEHOUSE_CACHE")
	if cache == "" {
		if dir, err := os.UserCacheDir(); err == nil {
			cache = filepath.Join(dir, "gatehouse")
		}
	}
	if cache != "" {
		if bin := filepath.Join(cache, "tools", "bin", "minio"); executable(bin) {
			return bin, nil
		}
	}
	if bin, err := exec.LookPath("minio"); err == nil {
		return bin, nil
	}
	return "", fmt.Errorf("the minio server binary is not installed (not in %s, %s/tools/bin or PATH): run `make setup-test` "+
		"(hack/go-tools.sh installs the pinned MinIO)", MinIOBinEnv, cache)
}

func executable(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.Mode().IsRegular() && info.Mode()&0o111 != 0
}

// writeCerts generates a CA and a server certificate for 127.0.0.1 and
// writes them where MinIO's --certs-dir expects them: certs/public.crt and
// certs/private.key (the CA stays in pki/).
func (m *MinIO) writeCerts() error {
	pkiDir, certsDir := filepath.Join(m.Dir, "pki"), filepath.Join(m.Dir, "certs")
	for _, dir := range []string{pkiDir, certsDir} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			return fmt.Errorf("creating %s: %w", dir, err)
		}
	}
	p, err := newPKI(pkiDir)
	if err != nil {
		return fmt.Errorf("generating the CA: %w", err)
	}
	certPEM, keyPEM, err := p.issue(certSpec{
		name: "minio", cn: "127.0.0.1", ips: []net.IP{net.IPv4(127, 0, 0, 1)}, dns: []string{"localhost"}, usages: serverUsage,
	})
	if err != nil {
		return err
	}
	if err := writeFile(filepath.Join(certsDir, "public.crt"), certPEM); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(certsDir, "private.key"), keyPEM); err != nil {
		return err
	}
	m.RootCAs = x509.NewCertPool()
	m.RootCAs.AddCert(p.ca)
	m.CACertPEM, m.CACertPath = p.caPEM, p.path("ca.crt")
	return nil
}

// environment returns the server's whole environment: the test's without
// any MINIO_* variable, plus random root credentials, no console, no update
// checks and, with sse, a random static KMS key. The secrets go to the
// process's environment, never to its command line or log.
func (m *MinIO) environment(sse bool) ([]string, error) {
	user, err := randomHex(10)
	if err != nil {
		return nil, err
	}
	password, err := randomHex(20)
	if err != nil {
		return nil, err
	}
	m.AccessKeyID, m.SecretAccessKey = "gh"+user, password
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MINIO_") {
			env = append(env, kv)
		}
	}
	env = append(env,
		"MINIO_ROOT_USER="+m.AccessKeyID,
		"MINIO_ROOT_PASSWORD="+m.SecretAccessKey,
		"MINIO_BROWSER=off",
		"MINIO_UPDATE=off",
		"MINIO_CI_CD=on",
	)
	if sse {
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("generating the KMS key: %w", err)
		}
		// MinIO's built-in single-key KMS: "<key-name>:<base64 of 32 bytes>".
		env = append(env, "MINIO_KMS_SECRET_KEY=gatehouse-test-key:"+base64.StdEncoding.EncodeToString(key))
	}
	return env, nil
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generating credentials: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// start runs the server on a free port, retrying on another port when the
// reserved one was taken meanwhile, and waits until it is live and the
// bucket exists.
func (m *MinIO) start(ctx context.Context, bin string, env []string) error {
	const attempts = 3
	for i := 1; ; i++ {
		ports, err := freePorts(1)
		if err != nil {
			return err
		}
		m.Endpoint = hostPort(ports[0])
		m.proc, err = startProcessEnv("minio", m.Dir, bin, env,
			"server", "--address", m.Endpoint,
			"--certs-dir", filepath.Join(m.Dir, "certs"),
			"--anonymous", "--quiet",
			filepath.Join(m.Dir, "data"))
		if err != nil {
			return err
		}
		err = m.proc.waitReady(ctx, 50*time.Millisecond, m.ready())
		if err == nil {
			return nil
		}
		// MinIO says "Specified port is already in use".
		if tail := m.proc.logTail(8192); i == attempts ||
			!strings.Contains(tail, "port is already in use") && !strings.Contains(tail, "address already in use") {
			return err
		}
		m.proc.stop()
	}
}

// ready returns the readiness check: /minio/health/live answers 200
// without marking the server offline (it answers before the object layer
// is initialised), and the bucket could be created.
func (m *MinIO) ready() func(context.Context) error {
	transport := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: m.RootCAs, MinVersion: tls.VersionTLS12}}
	httpClient := &http.Client{Timeout: 2 * time.Second, Transport: transport}
	liveURL := "https://" + m.Endpoint + "/minio/health/live"
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, liveURL, nil)
		if err != nil {
			return err
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", liveURL, resp.Status)
		}
		if status := resp.Header.Get("X-Minio-Server-Status"); status != "" {
			return fmt.Errorf("GET %s: server status %q", liveURL, status)
		}
		return m.makeBucket(ctx, transport)
	}
}

func (m *MinIO) makeBucket(ctx context.Context, transport http.RoundTripper) error {
	client, err := minio.New(m.Endpoint, &minio.Options{
		Creds:      credentials.NewStaticV4(m.AccessKeyID, m.SecretAccessKey, ""),
		Secure:     true,
		Transport:  transport,
		MaxRetries: 1, // the readiness poll retries
	})
	if err != nil {
		return fmt.Errorf("creating a MinIO client: %w", err)
	}
	err = client.MakeBucket(ctx, m.Bucket, minio.MakeBucketOptions{})
	var resp minio.ErrorResponse
	if errors.As(err, &resp) && resp.Code == minio.BucketAlreadyOwnedByYou {
		return nil
	}
	if err != nil {
		return fmt.Errorf("creating bucket %s: %w", m.Bucket, err)
	}
	return nil
}
