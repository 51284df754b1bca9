package mini

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/bootstrapstatus"
)

// Status prints the local cluster's nodes, or that there is none.
func Status(ctx context.Context, dir string, out io.Writer) error {
	return status(ctx, dir, out, providerFor)
}

// status is Status with the providers providerFor returns.
func status(ctx context.Context, dir string, out io.Writer, providerFor providerLookup) error {
	rec, err := ReadRecord(dir)
	if errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(out, "No local cluster in %s.\n", dir)
		return nil
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "Local cluster in %s, created %s.\n", dir, rec.Created.Format(time.RFC3339))
	for i := range rec.Nodes {
		n := &rec.Nodes[i]
		p, err := providerFor(rec, n)
		if err != nil {
			return err
		}
		status, _ := os.ReadFile(filepath.Join(n.Dir, bootstrapStatusFile))
		bootstrap := strings.TrimSpace(string(status))
		alive := p.Running(n)
		switch {
		case !alive:
			bootstrap = "off"
		case bootstrap == "":
			bootstrap = "running (" + bootstrapPhase(n.Dir) + ")"
		}
		fmt.Fprintf(out, "  %-10s %-5s running: %-5t bootstrap: %s\n", n.Name, p.Name(), alive, bootstrap)
	}
	if rec.Kubeconfig == "" {
		return nil
	}
	svc, err := servicesFromKubeconfig(rec.Kubeconfig)
	if err != nil {
		return err
	}
	fmt.Fprintln(out)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := svc.printNodes(ctx, out); err != nil {
		fmt.Fprintf(out, "The API server does not answer (%v). After `gatehouse mini start`, the control planes wait for `gatehouse recover` (docs/recovery.md).\n", err)
	}
	fmt.Fprintln(out)
	if rec.LoadBalancerPID > 0 {
		fmt.Fprintf(out, "API servers' load balancer: haproxy at %s, running: %t\n", rec.Network.loadBalancerEndpoint(), syscall.Kill(rec.LoadBalancerPID, 0) == nil)
	}
	members, err := EtcdMembers(ctx, dir)
	if err != nil {
		fmt.Fprintf(out, "etcd: %v\n", err)
		return nil
	}
	var list []string
	for _, m := range members {
		state := "healthy"
		switch {
		case !m.Healthy:
			state = "unhealthy"
		case m.IsLearner:
			state = "learner"
		}
		list = append(list, m.Name+" "+state)
	}
	fmt.Fprintf(out, "etcd: %d members (%s)\n", len(members), strings.Join(list, ", "))
	return nil
}

// bootstrapPhase is what the bootstrapper of the node in dir reports of
// its progress (bootstrapstatus), where the host sees the node's root (a
// netns node's); elsewhere what it may be doing.
func bootstrapPhase(dir string) string {
	if st, err := bootstrapstatus.Read(filepath.Join(dir, "root")); err == nil && st.Phase != "" {
		if st.Phase == bootstrapstatus.PhaseRejoining {
			// With every control plane down no join service answers: a
			// rebooted control plane then waits for gatehouse recover.
			return "rejoining through a join service, or waiting to be recovered"
		}
		return string(st.Phase)
	}
	return "joining, rejoining or waiting to be recovered"
}
