package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/cloudmeta/cloudmetatest"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

// testHash is a bcrypt hash as the instance metadata carries it.
const testHash = "$2a$10$N9qo8uLOickgx2ZMRZoMyeIjZAgcfl7p92ldGxad68LJZdL17lhWy"

func cloudVM() cloudmetatest.Instance {
	return cloudmetatest.Instance{
		Name: "ip-10-0-1-23", ID: "i-0123456789abcdef0", Project: "gatehouse-test", ProjectNumber: "123456789012",
		Zone: "eu-central-1a", Region: "eu-central-1", IPs: []string{"10.0.1.23"},
		Attributes: map[string]string{"gatehouse-join-endpoints": "10.0.1.5:9090,10.0.1.6:9090", "gatehouse-init-secret-hash": testHash},
	}
}

// resolved is what a node learnt from its cloud.
type resolved struct {
	Name, Address, ProviderID string
	Endpoints                 []string
	InitSecretHash            string
}

// resolveCloud parses args and resolves them with the real metadata client.
func resolveCloud(t testing.TB, args ...string) (resolved, error) {
	t.Helper()
	o, err := parseFlags("gatehouse-bootstrapper", append([]string{"--state-disk", "/dev/vdb"}, args...), "hostname-1")
	if err != nil {
		return resolved{}, err
	}
	if err := resolveFromMachine(t.Context(), o, machineFacts{cloud: openCloud}); err != nil {
		return resolved{}, err
	}
	r := resolved{Name: o.node.Name, Address: o.node.AdvertiseAddress, ProviderID: o.node.ProviderID}
	if r.Endpoints, err = o.endpoints.Endpoints(t.Context()); err != nil {
		return r, err
	}
	hash, err := cloudInitSecretHash(slog.New(slog.DiscardHandler), o)
	r.InitSecretHash = string(hash)
	return r, err
}

// TestResolveFromCloud: with --cloud the bootstrapper takes the node's
// name, address and provider ID, the join endpoints and the init secret's
// hash from each cloud's instance metadata (fakes answering as the clouds
// document), and flags given win.
func TestResolveFromCloud(t *testing.T) {
	for _, tc := range []struct {
		cloud, providerID string
		start             func(testing.TB, cloudmetatest.Instance) (*cloudmetatest.Fake, string)
	}{
		{"gce", "gce://gatehouse-test/eu-central-1a/ip-10-0-1-23", cloudmetatest.NewGCE},
		{"aws", "aws:///eu-central-1a/i-0123456789abcdef0", cloudmetatest.NewAWS},
	} {
		t.Run(tc.cloud, func(t *testing.T) {
			_, base := tc.start(t, cloudVM())
			for _, cloud := range []string{tc.cloud, "auto"} {
				got, err := resolveCloud(t, "--cloud", cloud, "--cloud-metadata-url", base)
				if err != nil {
					t.Fatalf("--cloud %s: %v", cloud, err)
				}
				want := resolved{Name: "ip-10-0-1-23", Address: "10.0.1.23", ProviderID: tc.providerID,
					Endpoints: []string{"10.0.1.5:9090", "10.0.1.6:9090"}, InitSecretHash: testHash}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("--cloud %s resolved %+v, want %+v", cloud, got, want)
				}
			}
			got, err := resolveCloud(t, "--cloud", tc.cloud, "--cloud-metadata-url", base, "--node-name", "cp-0",
				"--advertise-address", "192.0.2.10", "--join-endpoints", "192.0.2.1:9090")
			if err != nil || got.Name != "cp-0" || got.Address != "192.0.2.10" || !slices.Equal(got.Endpoints, []string{"192.0.2.1:9090"}) || got.ProviderID != tc.providerID {
				t.Errorf("flags given: %+v, %v; want them kept, the provider ID from the cloud", got, err)
			}
		})
	}
	t.Run("no init secret hash in the metadata", func(t *testing.T) {
		inst := cloudVM()
		delete(inst.Attributes, "gatehouse-init-secret-hash")
		_, base := cloudmetatest.NewGCE(t, inst)
		if got, err := resolveCloud(t, "--cloud", "gce", "--cloud-metadata-url", base); err != nil || got.InitSecretHash != "" {
			t.Fatalf("%+v, %v; want no hash and no error (the node can only join)", got, err)
		}
	})
	t.Run("no metadata service", func(t *testing.T) {
		// It asks again until its deadline (a minute at start).
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		o, err := parseFlags("gatehouse-bootstrapper", []string{"--state-disk", "/dev/vdb", "--cloud", "auto", "--cloud-metadata-url", "http://127.0.0.1:1"}, "h")
		if err != nil {
			t.Fatal(err)
		}
		if err := resolveFromMachine(ctx, o, machineFacts{cloud: openCloud}); err == nil || !strings.Contains(err.Error(), "--cloud auto") {
			t.Fatalf("error = %v, want one naming --cloud auto", err)
		}
	})
	t.Run("unknown cloud", func(t *testing.T) {
		if _, err := resolveCloud(t, "--cloud", "ibm"); err == nil || !strings.Contains(err.Error(), `--cloud "ibm"`) {
			t.Fatalf("error = %v", err)
		}
	})
}

// childEnv makes the test binary run TestCloudMetadataInNetworkNamespace's
// node side.
const childEnv = "GATEHOUSE_TEST_CLOUD_CHILD"

// TestCloudMetadataInNetworkNamespace serves the GCE metadata fake where
// the clouds serve it, at 169.254.169.254:80, inside a network namespace
// the test creates, and resolves a node there with --cloud auto and the
// default metadata address, in a process of its own in that namespace.
func TestCloudMetadataInNetworkNamespace(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		got, err := resolveCloud(t, "--cloud", "auto")
		if err != nil {
			t.Fatal(err)
		}
		_ = json.NewEncoder(os.Stdout).Encode(got)
		return
	}
	if os.Geteuid() != 0 {
		t.Fatal("creating a network namespace needs root (make test runs as root)")
	}
	ns := fmt.Sprintf("gh-cloud-%d", os.Getpid())
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ip("netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "delete", ns).Run() })
	ip("-n", ns, "link", "set", "lo", "up")
	ip("-n", ns, "addr", "add", "169.254.169.254/32", "dev", "lo")
	lis := testkit.ListenInNetNS(t, "/run/netns/"+ns, "169.254.169.254:80")
	srv := &http.Server{Handler: cloudmetatest.GCE(cloudVM()), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Close() })

	cmd := exec.CommandContext(t.Context(), "ip", "netns", "exec", ns, os.Args[0], "-test.run", "^TestCloudMetadataInNetworkNamespace$", "-test.v")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the node in the namespace: %v\n%s", err, out)
	}
	var got resolved
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "{") {
			if err := json.Unmarshal([]byte(line), &got); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got.ProviderID != "gce://gatehouse-test/eu-central-1a/ip-10-0-1-23" || got.Address != "10.0.1.23" || len(got.Endpoints) != 2 || got.InitSecretHash != testHash {
		t.Fatalf("resolved in the namespace: %+v\n%s", got, out)
	}
}
