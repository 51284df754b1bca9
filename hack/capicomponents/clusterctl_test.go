package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
)

// clusterctlEnv names the environment variable that may point at a
// clusterctl binary; without it the test looks in hack/capi-tools.sh's cache.
const clusterctlEnv = "GATEHOUSE_CLUSTERCTL"

// pinnedClusterAPI is the sigs.k8s.io/cluster-api version go.mod pins, the
// release whose clusterctl must accept the repository.
func pinnedClusterAPI(t *testing.T) string {
	t.Helper()
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == "sigs.k8s.io/cluster-api" {
				return m.Version
			}
		}
	}
	t.Fatal("the test binary's build information has no sigs.k8s.io/cluster-api module")
	return ""
}

// clusterctl returns the path of a clusterctl binary of the pinned Cluster
// API release: $GATEHOUSE_CLUSTERCTL, else the newest complete build of
// hack/capi-tools.sh under $GATEHOUSE_CACHE/capi-tools (the script's
// layout: <version>-<key>/bin). A missing binary fails the test.
func clusterctl(t *testing.T) string {
	t.Helper()
	want := pinnedClusterAPI(t)
	path := os.Getenv(clusterctlEnv)
	if path == "" {
		cache := os.Getenv("GATEHOUSE_CACHE")
		if cache == "" {
			dir, err := os.UserCacheDir()
			if err != nil {
				t.Fatal(err)
			}
			cache = filepath.Join(dir, "gatehouse")
		}
		builds, err := filepath.Glob(filepath.Join(cache, "capi-tools", want+"-*", "bin", ".complete"))
		if err != nil {
			t.Fatal(err)
		}
		var newest time.Time
		for _, b := range builds {
			if info, err := os.Stat(b); err == nil && info.ModTime().After(newest) {
				newest, path = info.ModTime(), filepath.Join(filepath.Dir(b), "clusterctl")
			}
		}
		if path == "" {
			t.Fatalf("no clusterctl %s in %s: run `make setup-test` (hack/capi-tools.sh builds it), or set %s to a clusterctl %s binary",
				want, filepath.Join(cache, "capi-tools"), clusterctlEnv, want)
		}
	}
	out, err := exec.CommandContext(t.Context(), path, "version", "-o", "short").Output()
	if err != nil {
		t.Fatalf("%s version: %v: run `make setup-test` (hack/capi-tools.sh), or set %s to a clusterctl %s binary", path, err, clusterctlEnv, want)
	}
	if got := strings.TrimSpace(string(out)); got != want {
		t.Fatalf("%s is clusterctl %s, want %s (go.mod's sigs.k8s.io/cluster-api): run `make setup-test`", path, got, want)
	}
	return path
}

// TestClusterctlAcceptsRepository runs the pinned release's clusterctl on a
// local provider repository holding config/clusterctl as gatehouse v0.1.0,
// with a config file of its own and no user configuration (HOME and
// XDG_CONFIG_HOME point into the test's directory, the environment is only
// what the case sets).
func TestClusterctlAcceptsRepository(t *testing.T) {
	bin := clusterctl(t)
	defaults := defaultObjects(t)
	for _, tc := range []struct {
		name    string
		args    []string          // after generate provider --bootstrap gatehouse:v0.1.0 --config <file>
		env     map[string]string // clusterctl variables from the environment
		config  string            // appended to the config file
		mutate  func(t *testing.T, versionDir string)
		wantErr string // in clusterctl's output; "" means success
		check   func(t *testing.T, objs []*unstructured.Unstructured)
	}{
		{
			name: "the components install as generated, with the variables at their defaults",
			check: func(t *testing.T, objs []*unstructured.Unstructured) {
				if len(objs) != len(defaults) {
					t.Fatalf("%d objects, want %d", len(objs), len(defaults))
				}
				for _, o := range objs {
					labels := o.GetLabels()
					if _, ok := labels[clusterctlv1.ClusterctlLabel]; !ok {
						t.Errorf("%s %s lacks clusterctl's label", o.GetKind(), o.GetName())
					}
					delete(labels, clusterctlv1.ClusterctlLabel)
					o.SetLabels(labels)
					// clusterctl converts CRDs and Deployments to typed
					// objects on the way, which adds an empty status.
					delete(o.Object, "status")
					want := find(t, defaults, o.GetKind(), o.GetName())
					if !equality.Semantic.DeepEqual(o.Object, want.Object) {
						t.Errorf("%s %s differs from the committed one with defaults substituted", o.GetKind(), o.GetName())
					}
				}
			},
		},
		{
			name: "variables from the environment replace the defaults",
			env:  map[string]string{"GATEHOUSE_CAPI_CONCURRENCY": "3", "GATEHOUSE_CAPI_BOOTSTRAP_IMAGE": "registry.example.com/gcb:dev"},
			check: func(t *testing.T, objs []*unstructured.Unstructured) {
				if img := managerContainer(t, objs)["image"]; img != "registry.example.com/gcb:dev" {
					t.Errorf("image %v", img)
				}
				if args := managerArgs(t, objs); !slices.Contains(args, "--concurrency=3") || !slices.Contains(args, "--log-level=info") {
					t.Errorf("args %q", args)
				}
			},
		},
		{
			name:   "variables from the config file replace the defaults",
			config: "GATEHOUSE_CAPI_LOG_LEVEL: debug\n",
			check: func(t *testing.T, objs []*unstructured.Unstructured) {
				if args := managerArgs(t, objs); !slices.Contains(args, "--log-level=debug") {
					t.Errorf("args %q", args)
				}
			},
		},
		{
			name:   "clusterctl's image override for the provider applies",
			config: "images:\n  bootstrap-gatehouse:\n    repository: mirror.example.com/gatehouse\n",
			check: func(t *testing.T, objs []*unstructured.Unstructured) {
				if img := managerContainer(t, objs)["image"]; img != "mirror.example.com/gatehouse/gatehouse-capi-bootstrap:v0.1.0" {
					t.Errorf("image %v", img)
				}
			},
		},
		{
			name: "--target-namespace moves every namespaced object and the binding's subject",
			args: []string{"--target-namespace", "capi-gatehouse"},
			check: func(t *testing.T, objs []*unstructured.Unstructured) {
				find(t, objs, "Namespace", "capi-gatehouse")
				for _, kind := range []string{"ServiceAccount", "Deployment"} {
					for _, o := range objs {
						if o.GetKind() == kind && o.GetNamespace() != "capi-gatehouse" {
							t.Errorf("%s %s in namespace %q", kind, o.GetName(), o.GetNamespace())
						}
					}
				}
				subjects, _, _ := unstructured.NestedSlice(find(t, objs, "ClusterRoleBinding", managerName).Object, "subjects")
				if len(subjects) != 1 || subjects[0].(map[string]any)["namespace"] != "capi-gatehouse" {
					t.Errorf("subjects %v", subjects)
				}
			},
		},
		{
			// clusterctl parses images before substituting variables when
			// it does not substitute them (--describe, --raw); the image is
			// a variable, so both fail. init and upgrade substitute first.
			name:    "--describe cannot parse the image variable (clusterctl limitation)",
			args:    []string{"--describe"},
			wantErr: "couldn't parse image name: invalid reference format",
		},
		{
			name: "a release series of another contract is refused",
			mutate: func(t *testing.T, dir string) {
				replaceInFile(t, filepath.Join(dir, metadataFile), "contract: "+contractVersion, "contract: v1alpha3")
			},
			wantErr: "detected v1alpha3 for provider gatehouse",
		},
		{
			name: "a version outside every release series is refused",
			mutate: func(t *testing.T, dir string) {
				replaceInFile(t, filepath.Join(dir, metadataFile), "minor: 1", "minor: 2")
			},
			wantErr: "version v0.1.0 for the provider gatehouse does not match any release series",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			versionDir := filepath.Join(dir, "repository", providerLabel, defaultVersion)
			if err := os.MkdirAll(versionDir, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{metadataFile, componentsFile} {
				if err := os.WriteFile(filepath.Join(versionDir, name), committed(t, name), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if tc.mutate != nil {
				tc.mutate(t, versionDir)
			}
			config := filepath.Join(dir, "clusterctl.yaml")
			if err := os.WriteFile(config, []byte(`providers:
- name: gatehouse
  type: BootstrapProvider
  url: file://`+filepath.Join(versionDir, componentsFile)+`
CLUSTERCTL_DISABLE_VERSIONCHECK: "true"
`+tc.config), 0o600); err != nil {
				t.Fatal(err)
			}
			home := filepath.Join(dir, "home")
			env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "XDG_CONFIG_HOME=" + filepath.Join(home, ".config"), "GOPROXY=off"}
			for k, v := range tc.env {
				env = append(env, k+"="+v)
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, append([]string{"generate", "provider", "--bootstrap", "gatehouse:" + defaultVersion, "--config", config}, tc.args...)...)
			cmd.Env = env
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(stderr.String(), tc.wantErr) {
					t.Fatalf("clusterctl: %v, stderr %q; want a failure saying %q", err, stderr.String(), tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("clusterctl %q: %v\n%s", cmd.Args, err, stderr.String())
			}
			objs := parseObjects(t, stdout.Bytes())
			for _, o := range objs {
				if got := o.GetLabels()["cluster.x-k8s.io/provider"]; got != providerLabel {
					t.Errorf("%s %s: provider label %q", o.GetKind(), o.GetName(), got)
				}
			}
			tc.check(t, objs)
		})
	}
}

func replaceInFile(t *testing.T, path, old, replacement string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(old)) {
		t.Fatalf("%s has no %q", path, old)
	}
	if err := os.WriteFile(path, bytes.Replace(b, []byte(old), []byte(replacement), 1), 0o600); err != nil {
		t.Fatal(err)
	}
}
