package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/choose"
	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
)

// serveEvidence answers verifiers with the node's fresh evidence, behind
// the evidence endpoint's door (docs/continuous-attestation.md, "The
// evidence endpoint's door").
func serveEvidence(log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("serve-evidence", flag.ExitOnError)
	listen := fs.String("listen", ":9001", "address verifiers connect to")
	attesterOptions := attesterFlags(fs)
	limits := atls.DefaultEvidenceLimits()
	clientCA := fs.String("client-ca", "/etc/kubernetes/pki/ca.crt", "the cluster CA (PEM) as this node sees it, which kubeadm writes when the node joins: "+
		"while it does not exist anyone is answered; once it does, only client certificates it issued in the groups of --allowed-groups (read again every second)")
	groups := fs.String("allowed-groups", strings.Join(atls.DefaultVerifierOrganizations(), ","),
		"comma-separated client certificate organizations answered once the node has its cluster CA: the join service's (gatehouse:verifiers) and administrators'; system:nodes is refused")
	hsRate := fs.Float64("handshake-rate", limits.Handshakes.Rate, "new connections per second allowed per source address (IPv6: per /64), before any TLS")
	hsBurst := fs.Int("handshake-burst", limits.Handshakes.Burst, "new connections a source address may open at once")
	maxSourceConns := fs.Int("max-connections-per-source", limits.PerSource, "open connections per source address at most")
	maxConns := fs.Int("max-connections", limits.Total, "open connections at most")
	hsTimeout := fs.Duration("handshake-timeout", atls.DefaultEvidenceHandshakeTimeout, "longest connection: door, quote (waiting in the queue included) and key activation")
	idleTimeout := fs.Duration("idle-timeout", atls.DefaultEvidenceIdleTimeout, "how long a connection that served evidence waits for its caller's next request (the join service keeps one per node); negative closes each after its first evidence")
	quoteQueue := fs.Int("quote-queue", atls.DefaultQuoteQueue, "quotes that may wait while one is made; a connection beyond them gets no quote and is closed")
	metricsListen := fs.String("metrics-listen", "", "HTTP address of /metrics (refusals by reason, queue length); empty serves none")
	if err := fs.Parse(args); err != nil {
		return err
	}
	attester, err := attesterOptions()
	if err != nil {
		return err
	}
	if *clientCA == "" {
		return errors.New("--client-ca must name the cluster CA file (it need not exist yet)")
	}
	if *quoteQueue < 1 {
		return fmt.Errorf("--quote-queue %d: at least 1", *quoteQueue)
	}
	if *hsTimeout <= 0 {
		return fmt.Errorf("--handshake-timeout %s must be positive", *hsTimeout)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	node, err := choose.OpenAttester(attester)
	if err != nil {
		return err
	}
	defer node.Close()
	logTCGEventLog(log, node.TCGEventLog)
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	if *metricsListen != "" {
		go serveMetrics(log, *metricsListen, reg)
	}
	orgs := splitList(*groups)
	if orgs == nil {
		orgs = []string{} // refused by name, not replaced by the defaults
	}
	log.Info("Serving evidence", "address", lis.Addr().String(), "clientCA", *clientCA, "allowedGroups", orgs)
	endpoint := atls.EvidenceEndpoint{
		Attester: node.Attester, ClientCAFile: *clientCA, Organizations: orgs,
		Limits: connlimit.Limits{
			Handshakes: connlimit.Rate{Rate: *hsRate, Burst: *hsBurst}, PerSource: *maxSourceConns, Total: *maxConns,
		},
		QuoteQueue: *quoteQueue, HandshakeTimeout: *hsTimeout, IdleTimeout: *idleTimeout, Log: log, Registerer: reg,
	}
	if err := endpoint.Serve(ctx, lis); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
