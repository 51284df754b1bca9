package bootstrapper

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	joinservicev1 "github.com/gatehouse-dev/gatehouse/api/joinservice/v1"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/nodelock"
	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
	"github.com/gatehouse-dev/gatehouse/internal/grpcopts"
)

// joinServiceCalls calls the join service as this node: over attested TLS
// (joinCredentials) to each endpoint in turn, round after round with
// backoff, until the node lock is taken. The JoinClient and the rejoin
// share it.
type joinServiceCalls struct {
	log        *slog.Logger
	lock       *nodelock.Lock
	endpoints  EndpointSource
	attester   attestation.Attester
	caCertHash string
	backoff    Backoff
	now        func() time.Time
}

// call calls fn on each endpoint in turn, round after round with
// backoff, until one succeeds. It gives up on ctx's end, when the lock is
// taken, and on answers that retrying cannot change (PermissionDenied,
// InvalidArgument, FailedPrecondition).
func (j *joinServiceCalls) call(ctx context.Context, what string, fn func(context.Context, joinservicev1.JoinServiceClient) error) error {
	log := j.log
	for round := 0; ; round++ {
		if j.lock.Locked() {
			return nodelock.ErrLocked
		}
		endpoints, err := j.endpoints.Endpoints(ctx)
		if err != nil {
			log.Warn("No join service endpoints yet", "error", err.Error())
		}
		var retryAfter time.Duration // the shortest RetryInfo of the round
		for _, ep := range endpoints {
			err := j.callOne(ctx, ep, fn)
			if err == nil {
				return nil
			}
			if d, ok := retryDelay(err); ok {
				if retryAfter == 0 || d < retryAfter {
					retryAfter = d
				}
				log.Info("The join service asks to retry later", "endpoint", ep, "request", what, "after", d.String(), "reason", status.Convert(err).Message())
				continue
			}
			switch status.Code(err) {
			case codes.PermissionDenied, codes.InvalidArgument, codes.FailedPrecondition:
				return fmt.Errorf("the join service at %s refused the %s request: %w", ep, what, err)
			}
			if rejectedEvidence(err) {
				log.Error("The join service refused this node's attestation evidence; its audit log names the reason "+
					"(e.g. measurement_mismatch). Retrying in case its policy changes.", "endpoint", ep, "request", what, "round", round)
				continue
			}
			if closedAfterHandshake(err) {
				log.Error("The join service closed the connection right after the attested handshake: it probably refused this "+
					"node's attestation evidence (its audit log names the reason, e.g. measurement_mismatch). Retrying.",
					"endpoint", ep, "request", what, "round", round, "error", err.Error())
				continue
			}
			log.Warn("Join service call failed; trying the next endpoint", "endpoint", ep, "request", what, "round", round, "error", err.Error())
		}
		if retryAfter > 0 {
			// Waiting its turn is not a failure: the backoff does not grow.
			err = waitFor(ctx, retryAfter, j.lock.Taken())
		} else {
			err = j.backoff.wait(ctx, round, j.lock.Taken())
		}
		if err != nil {
			return err
		}
	}
}

// retryDelay returns the delay of err's google.rpc.RetryInfo detail, if
// it has one between 0 and a minute.
func retryDelay(err error) (time.Duration, bool) {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.RetryInfo); ok {
			delay := info.GetRetryDelay().AsDuration()
			return delay, delay > 0 && delay <= time.Minute
		}
	}
	return 0, false
}

// rejectedEvidence reports whether err is the join service refusing this
// node's attested TLS certificate (TLS alert bad_certificate, RFC 8446
// §6.2): the service does not tell a refused client why.
func rejectedEvidence(err error) bool {
	return status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), "tls: bad certificate")
}

// closedAfterHandshake reports whether err is the connection closed under
// the client as it sent its first request. In TLS 1.3 the server checks
// the client's certificate after the client considers the handshake done,
// so a refusal's bad_certificate alert can lose the race against the
// client's first write, which then fails with EPIPE or ECONNRESET instead.
func closedAfterHandshake(err error) bool {
	return status.Code(err) == codes.Unavailable &&
		(strings.Contains(err.Error(), "broken pipe") || strings.Contains(err.Error(), "connection reset by peer"))
}

func (j *joinServiceCalls) callOne(ctx context.Context, endpoint string, fn func(context.Context, joinservicev1.JoinServiceClient) error) error {
	creds, err := joinCredentials(j.attester, j.caCertHash, j.now)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(endpoint, append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, grpcopts.Dial()...)...)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return fn(ctx, joinservicev1.NewJoinServiceClient(conn))
}

// joinCredentials returns the attested TLS credentials a joiner dials the
// join service with (docs/joinservice.md, "Trust decisions"): the joiner
// attests with attester, and trusts the service by the cluster CA's
// discovery token CA cert hash ("sha256:<64 hex>", kubeadm reference,
// "kubeadm join"; see clusterpki.VerifyClusterIdentity). now is the clock;
// nil is time.Now. A malformed hash is an error.
func joinCredentials(attester attestation.Attester, caCertHash string, now func() time.Time) (*atls.Credentials, error) {
	if now == nil {
		now = time.Now
	}
	verify, err := clusterpki.VerifyClusterIdentity(caCertHash, now)
	if err != nil {
		return nil, err
	}
	return atls.NewCredentials(atls.Config{Attester: attester, VerifyPeer: verify, Now: now})
}
