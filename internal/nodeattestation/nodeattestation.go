// Package nodeattestation is the authoritative attestation state of each
// node: the verdict continuous attestation reached on the node's fresh
// evidence, whether the node must be tainted, and whether an administrator
// must restore it. It lives in a ConfigMap per node in Gatehouse's
// namespace, which only Gatehouse (and cluster administrators) can write:
// a node's kubelet credentials can patch its own Node, never these
// (docs/continuous-attestation.md, "The verdict"). The Node condition
// gatehouse.dev/Attested and the taint gatehouse.dev/unattested are mirrors
// of it; `gatehouse verify --all`, the taint decision and every credential
// decision read this record.
package nodeattestation

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Label marks a record ConfigMap.
const Label = "gatehouse.dev/node-attestation"

// namePrefix prefixes a record ConfigMap's name.
const namePrefix = "gatehouse-attestation-"

// Keys of a record ConfigMap's data.
const (
	keyNode             = "node"
	keyAttested         = "attested"
	keyReason           = "reason"
	keyMessage          = "message"
	keyIdentity         = "identity"
	keyAddress          = "address"
	keySince            = "since"
	keyCheckedAt        = "checkedAt"
	keyUnreachableSince = "unreachableSince"
	keyTainted          = "tainted"
	keyAwaitingRestore  = "awaitingRestore"
	keyRestoredBy       = "restoredBy"
	keyRestoredAt       = "restoredAt"
)

// Record is one node's attestation state.
type Record struct {
	// Node is the node name.
	Node string
	// Attested is the verdict: the node's fresh evidence verified.
	Attested bool
	// Reason is the condition's reason (Verified, EvidenceRejected, ...);
	// Message says what differed; never a secret.
	Reason, Message string
	// Identity is the attestation identity the evidence came from, when
	// known; Address where it was fetched.
	Identity, Address string
	// Since is when Attested last changed.
	Since time.Time
	// CheckedAt is the last verification (the record's heartbeat).
	CheckedAt time.Time
	// UnreachableSince, when set, is since when the node has not answered
	// (or answered rebooting): the grace period counts from it.
	UnreachableSince time.Time
	// Tainted says the node must carry the taint gatehouse.dev/unattested.
	Tainted bool
	// AwaitingRestore says an administrator must restore the node
	// (`gatehouse node restore`) before it gets any credential or loses
	// its taint: it failed under `restore: admin`.
	AwaitingRestore bool
	// RestoredBy and RestoredAt record the last administrator's restore.
	RestoredBy string
	RestoredAt time.Time
}

// recordName returns the name of node's record ConfigMap:
// "gatehouse-attestation-" and the first 32 hex digits of SHA-256(node), a
// fixed length whatever the node name's.
func recordName(node string) string {
	sum := sha256.Sum256([]byte(node))
	return namePrefix + hex.EncodeToString(sum[:16])
}

// ErrNoRecord means no record exists for the node: it was never judged.
var ErrNoRecord = errors.New("no attestation record")

// fromConfigMap reads the record cm holds. It returns an error when cm is
// not a record, or names another node than want (when want is not "").
func fromConfigMap(cm *corev1.ConfigMap, want string) (Record, error) {
	d := cm.Data
	if d[keyNode] == "" || (want != "" && d[keyNode] != want) || cm.Name != recordName(d[keyNode]) {
		return Record{}, fmt.Errorf("ConfigMap %s/%s is not the attestation record of node %q", cm.Namespace, cm.Name, want)
	}
	r := Record{
		Node: d[keyNode], Reason: d[keyReason], Message: d[keyMessage], Identity: d[keyIdentity], Address: d[keyAddress],
		RestoredBy: d[keyRestoredBy],
	}
	var errs []error
	for key, dst := range map[string]*bool{keyAttested: &r.Attested, keyTainted: &r.Tainted, keyAwaitingRestore: &r.AwaitingRestore} {
		if v, ok := d[key]; ok {
			b, err := strconv.ParseBool(v)
			errs = append(errs, err)
			*dst = b
		}
	}
	for key, dst := range map[string]*time.Time{keySince: &r.Since, keyCheckedAt: &r.CheckedAt, keyUnreachableSince: &r.UnreachableSince, keyRestoredAt: &r.RestoredAt} {
		if v, ok := d[key]; ok && v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			errs = append(errs, err)
			*dst = t
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Record{}, fmt.Errorf("attestation record of node %s: %w", r.Node, err)
	}
	return r, nil
}

// data is r as a record ConfigMap's data.
func (r Record) data() map[string]string {
	d := map[string]string{
		keyNode: r.Node, keyAttested: strconv.FormatBool(r.Attested), keyReason: r.Reason, keyMessage: r.Message,
		keyTainted: strconv.FormatBool(r.Tainted), keyAwaitingRestore: strconv.FormatBool(r.AwaitingRestore),
	}
	for key, v := range map[string]string{keyIdentity: r.Identity, keyAddress: r.Address, keyRestoredBy: r.RestoredBy} {
		if v != "" {
			d[key] = v
		}
	}
	for key, t := range map[string]time.Time{keySince: r.Since, keyCheckedAt: r.CheckedAt, keyUnreachableSince: r.UnreachableSince, keyRestoredAt: r.RestoredAt} {
		if !t.IsZero() {
			d[key] = t.UTC().Format(time.RFC3339Nano)
		}
	}
	return d
}

// Store reads and writes records in one namespace through the API server.
// It is safe for concurrent use.
type Store struct {
	client    kubernetes.Interface
	namespace string
}

// NewStore returns the records kept in namespace.
func NewStore(client kubernetes.Interface, namespace string) *Store {
	return &Store{client: client, namespace: namespace}
}

// Get reads node's record from the API server. It returns an error
// wrapping ErrNoRecord when there is none.
func (s *Store) Get(ctx context.Context, node string) (Record, error) {
	cm, err := s.client.CoreV1().ConfigMaps(s.namespace).Get(ctx, recordName(node), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return Record{}, fmt.Errorf("%w of node %s", ErrNoRecord, node)
	}
	if err != nil {
		return Record{}, fmt.Errorf("reading the attestation record of node %s: %w", node, err)
	}
	return fromConfigMap(cm, node)
}

// Current is a record as last read, with what a conditional write needs.
type Current struct {
	Record Record
	// Exists is false when there is no record yet.
	Exists bool
	// ResourceVersion is the record ConfigMap's, when it exists.
	ResourceVersion string
}

// Update applies change to node's record and writes the result. It starts
// from cur (for example a cache's copy; nil reads the API server), and
// when another writer changed the record meanwhile it reads it again and
// retries, so change may be called several times. change returns the
// record to write, or write false to leave it as it is. Update returns the
// record as written (or left).
func (s *Store) Update(ctx context.Context, node string, cur *Current, change func(old Record, exists bool) (rec Record, write bool)) (Record, error) {
	cms := s.client.CoreV1().ConfigMaps(s.namespace)
	for range 5 {
		if cur == nil {
			c, err := s.current(ctx, node)
			if err != nil {
				return Record{}, err
			}
			cur = &c
		}
		rec, write := change(cur.Record, cur.Exists)
		if !write {
			return cur.Record, nil
		}
		rec.Node = node
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: recordName(node), Namespace: s.namespace, Labels: map[string]string{Label: "true"},
				ResourceVersion: cur.ResourceVersion},
			Data: rec.data(),
		}
		var err error
		if cur.Exists {
			_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		} else {
			_, err = cms.Create(ctx, cm, metav1.CreateOptions{})
		}
		if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || (cur.Exists && apierrors.IsNotFound(err)) {
			cur = nil
			continue
		}
		if err != nil {
			return Record{}, fmt.Errorf("writing the attestation record of node %s: %w", node, err)
		}
		return rec, nil
	}
	return Record{}, fmt.Errorf("writing the attestation record of node %s: it kept changing; retry", node)
}

// current reads node's record from the API server.
func (s *Store) current(ctx context.Context, node string) (Current, error) {
	cm, err := s.client.CoreV1().ConfigMaps(s.namespace).Get(ctx, recordName(node), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return Current{}, nil
	}
	if err != nil {
		return Current{}, fmt.Errorf("reading the attestation record of node %s: %w", node, err)
	}
	r, err := fromConfigMap(cm, node)
	if err != nil {
		return Current{}, err
	}
	return Current{Record: r, Exists: true, ResourceVersion: cm.ResourceVersion}, nil
}

// Restore clears node's AwaitingRestore as administrator by (audited by
// the caller), keeping the rest of the record: the next verification that
// succeeds untaints the node. It returns the record before the restore, or
// an error wrapping ErrNoRecord.
func (s *Store) Restore(ctx context.Context, node, by string, now time.Time) (Record, error) {
	var before Record
	_, err := s.Update(ctx, node, nil, func(old Record, ok bool) (Record, bool) {
		before = old
		if !ok {
			return old, false
		}
		old.AwaitingRestore, old.RestoredBy, old.RestoredAt = false, by, now
		return old, true
	})
	if err == nil && before.Node == "" {
		return Record{}, fmt.Errorf("%w of node %s: continuous attestation has not judged it", ErrNoRecord, node)
	}
	return before, err
}

// Delete removes node's record if it is still at resourceVersion: a record
// written meanwhile is kept (the writer saw a reason to). A record already
// gone is no error.
func (s *Store) Delete(ctx context.Context, node, resourceVersion string) error {
	err := s.client.CoreV1().ConfigMaps(s.namespace).Delete(ctx, recordName(node), metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{ResourceVersion: &resourceVersion},
	})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("deleting the attestation record of node %s: %w", node, err)
	}
	return nil
}

// List reads every record in the namespace from the API server.
func (s *Store) List(ctx context.Context) ([]Record, error) {
	list, err := s.client.CoreV1().ConfigMaps(s.namespace).List(ctx, metav1.ListOptions{LabelSelector: Label + "=true"})
	if err != nil {
		return nil, fmt.Errorf("listing the attestation records in %s: %w", s.namespace, err)
	}
	out := make([]Record, 0, len(list.Items))
	for i := range list.Items {
		r, err := fromConfigMap(&list.Items[i], "")
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}
