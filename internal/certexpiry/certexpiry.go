// Package certexpiry exports when the certificates a service loaded expire,
// as the Prometheus gauge gatehouse_certificate_expiry_timestamp_seconds
// (Unix seconds, labelled certificate=<name>), for the alerts of
// docs/operations.md ("GatehouseCertificateExpiresSoon"). Gatehouse's
// services read their certificates once, at start-up; so does Register,
// beside them, and the gauge says when what the process holds expires: a
// renewed file counts once the service restarts.
package certexpiry

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metricName is the gauge's name.
const metricName = "gatehouse_certificate_expiry_timestamp_seconds"

// Register reads each file of files (certificate name → path of a PEM
// file: a certificate, a chain or a CA bundle) and registers with reg the
// gauge metricName, one series per name, valued at the earliest NotAfter
// among the file's certificates (RFC 5280 §4.1.2.5), in Unix seconds. It
// errors when a file cannot be read, holds no PEM CERTIFICATE block or a
// block that does not parse, or when reg refuses the gauge.
func Register(reg prometheus.Registerer, files map[string]string) error {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: metricName,
		Help: "When a certificate this process loaded at start-up expires (the earliest NotAfter of its file's certificates), in Unix seconds, by certificate.",
	}, []string{"certificate"})
	for name, path := range files {
		notAfter, err := earliestNotAfter(path)
		if err != nil {
			return fmt.Errorf("certificate %s: %w", name, err)
		}
		g.WithLabelValues(name).Set(float64(notAfter.Unix()))
	}
	if err := reg.Register(g); err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	return nil
}

// earliestNotAfter returns the earliest NotAfter among the PEM
// certificates in path.
func earliestNotAfter(path string) (time.Time, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, fmt.Errorf("reading %s: %w", path, err)
	}
	var earliest time.Time
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return time.Time{}, fmt.Errorf("parsing a certificate of %s: %w", path, err)
		}
		if earliest.IsZero() || cert.NotAfter.Before(earliest) {
			earliest = cert.NotAfter
		}
	}
	if earliest.IsZero() {
		return time.Time{}, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return earliest, nil
}
