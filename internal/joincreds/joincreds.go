// Package joincreds is the joiner's side of the join service's attested
// TLS (docs/joinservice.md, "Trust decisions"): a node attests with its
// attester and trusts the service by the cluster identity it was
// provisioned with. It holds no server code, so nodes link only this.
package joincreds

import (
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
)

// Client returns the attested TLS credentials a joiner dials the join
// service with: the joiner attests with attester, and trusts the service by
// the cluster CA's discovery token CA cert hash ("sha256:<64 hex>", kubeadm
// reference, "kubeadm join"; see clusterpki.VerifyClusterIdentity). now is
// the clock; nil is time.Now. A malformed hash is an error.
func Client(attester attestation.Attester, caCertHash string, now func() time.Time) (*atls.Credentials, error) {
	if now == nil {
		now = time.Now
	}
	verify, err := clusterpki.VerifyClusterIdentity(caCertHash, now)
	if err != nil {
		return nil, err
	}
	return atls.NewCredentials(atls.Config{Attester: attester, VerifyPeer: verify, Now: now})
}
