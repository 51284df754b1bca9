package atls

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"time"
)

// AdministratorOrganizations returns kubeadm's administrators' groups:
// kubeadm:cluster-admins (admin.conf) and system:masters
// (super-admin.conf). A node's upgrade agent answers only these: not the
// join service's gatehouse:verifiers, not a node.
func AdministratorOrganizations() []string {
	return []string{"kubeadm:cluster-admins", "system:masters"}
}

// ClientCertDoor is the door of a node's administrative endpoint (the
// upgrade agent): a TLS 1.3 server configuration that requires a client
// certificate chaining to the cluster CA file, as read at most a second
// before, for client authentication, with one of the allowed
// organizations. Unlike the evidence endpoint it answers nobody while
// the node has no cluster CA. It is safe for concurrent use.
type ClientCertDoor struct {
	cas  *clientCAs
	orgs []string
	now  func() time.Time
	log  *slog.Logger
}

// NewClientCertDoor returns the door for the cluster CA at caFile (PEM;
// kubeadm's /etc/kubernetes/pki/ca.crt) and orgs. It refuses an empty
// list and a node credential's group (checkOrganizations). log receives
// one line per refused caller (its subject and why, never a key).
func NewClientCertDoor(caFile string, orgs []string, log *slog.Logger) (*ClientCertDoor, error) {
	if caFile == "" {
		return nil, errors.New("no client CA file: name the cluster CA (kubeadm's /etc/kubernetes/pki/ca.crt)")
	}
	if err := checkOrganizations(orgs); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &ClientCertDoor{orgs: orgs, now: time.Now, log: log}
	d.cas = &clientCAs{path: caFile, recheck: defaultClientCARecheck, now: d.now, log: log}
	return d, nil
}

// errNoClusterCA refuses every caller of a node that has not joined.
var errNoClusterCA = errors.New("this node has no cluster CA yet (it has not joined): its administrative endpoint answers nobody")

// TLSConfig returns the server configuration: serverCert gives the
// node's certificate for each handshake (read again each time, so a
// renewed one is used at once).
func (d *ClientCertDoor) TLSConfig(serverCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(chi *tls.ClientHelloInfo) (*tls.Config, error) {
			var r refusal
			pool, err := d.cas.current()
			if err == nil && pool == nil {
				err = errNoClusterCA
			}
			if err != nil {
				d.refused(chi, ReasonCAUnreadable, "", err)
				return nil, err
			}
			return &tls.Config{
				MinVersion:     tls.VersionTLS13,
				GetCertificate: serverCert,
				// Request, and refuse in VerifyConnection, so that an anonymous
				// caller is refused with its reason logged too.
				ClientAuth: tls.RequestClientCert,
				VerifyConnection: func(cs tls.ConnectionState) error {
					if err := checkClient(cs.PeerCertificates, pool, d.orgs, d.now(), &r); err != nil {
						d.refused(chi, r.reason, r.subject, err)
						return err
					}
					return nil
				},
			}, nil
		},
	}
}

func (d *ClientCertDoor) refused(chi *tls.ClientHelloInfo, reason, subject string, err error) {
	source := ""
	if chi.Conn != nil {
		source = chi.Conn.RemoteAddr().String()
	}
	d.log.Warn("Refused a caller at the door", "source", source, "reason", reason, "subject", subject, "error", err.Error())
}
