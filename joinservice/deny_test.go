package joinservice

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-sev-guest/kds"
	"github.com/google/go-tdx-guest/pcs"
	pb "github.com/google/go-tdx-guest/proto/tdx"
	tdxverify "github.com/google/go-tdx-guest/verify"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"sigs.k8s.io/yaml"

	joinservicev1 "github.com/gatehouse-dev/gatehouse/api/joinservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/cvm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp/snpguest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp/snptest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tdx/tdxguest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tdx/tdxtest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm/swtpmtest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
	"github.com/gatehouse-dev/gatehouse/joinservice/joinconfig"
)

// applyDenyList writes the deny list and waits until the service applied
// this version.
func (h *harness) applyDenyList(t testing.TB, text string) {
	t.Helper()
	applied := testutil.ToFloat64(h.server.cfg.PolicyStore.reloads.WithLabelValues(testDenyList, "applied"))
	h.putConfigMap(t, testDenyList, map[string]string{joinconfig.KeyDenyList: text})
	h.waitReloads(t, testDenyList, "applied", applied+1)
}

// applyKeyTrust replaces the join policy's key trust (pinned AKs, EK
// roots) with trust, e.g. a gce section, and waits until it is applied.
func (h *harness) applyKeyTrust(t testing.TB, trust map[string]any) {
	t.Helper()
	data := h.joinConfigData(t, nil)
	doc := map[string]any{}
	if err := yaml.Unmarshal([]byte(data[joinconfig.KeyAttestation]), &doc); err != nil {
		t.Fatal(err)
	}
	delete(doc, "pinnedAKs")
	for k, v := range trust {
		doc[k] = v
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	data[joinconfig.KeyAttestation] = string(out)
	h.applyJoinConfig(t, data)
}

// deniedEverywhere runs the attack of a machine the deny list names by
// entry: machine joins as node while it is not denied; once the entry is
// in force, its join, its rejoin and its rejoin renewing node's
// credentials are each refused PermissionDenied with audit reason
// "denied", and none leaves a token, a key fetched or a binding behind;
// so is a rejoin naming no node, unless the entry is the node name. The
// deny list is emptied again at the end.
func (h *harness) deniedEverywhere(t *testing.T, machine attestation.Attester, node string, ip net.IP, entry string) {
	t.Helper()
	ctx := t.Context()
	client := h.dial(t, machine, "")
	join := joinRequest(t, node, ip, false)
	if _, err := client.IssueJoinTicket(ctx, join); err != nil {
		t.Fatalf("joining before the deny list names it: %v", err)
	}
	h.applyDenyList(t, "# "+t.Name()+"\n"+entry+"\n")
	defer h.applyDenyList(t, "")

	before := h.snapshot(t)
	_, err := client.IssueJoinTicket(ctx, joinRequest(t, node, ip, false))
	h.refused(t, err, codes.PermissionDenied, "IssueJoinTicket", "denied")
	h.assertNothingIssued(t, before)

	_, err = client.IssueRejoinTicket(ctx, &joinservicev1.IssueRejoinTicketRequest{DiskUuid: join.GetDiskUuid(), RenewKubeletCredentialsFor: node})
	h.refused(t, err, codes.PermissionDenied, "IssueRejoinTicket", "denied")
	h.assertNothingIssued(t, before)

	if entry == "node:"+node {
		return
	}
	if !h.auditListsIdentity(t, entry) {
		t.Errorf("no audit line lists %s among the evidence's identities:\n%s", entry, h.logs.String())
	}
	_, err = client.IssueRejoinTicket(ctx, &joinservicev1.IssueRejoinTicketRequest{DiskUuid: uuid.NewString()})
	h.refused(t, err, codes.PermissionDenied, "IssueRejoinTicket", "denied")
	h.assertNothingIssued(t, before)
}

// auditListsIdentity reports whether an audit line lists id among the
// identities of its evidence, where an administrator finds what to deny.
func (h *harness) auditListsIdentity(t testing.TB, id string) bool {
	t.Helper()
	for _, line := range strings.Split(h.logs.String(), "\n") {
		var e struct {
			Evidence struct {
				Identities []string `json:"identities"`
			} `json:"evidence"`
		}
		if json.Unmarshal([]byte(line), &e) == nil && slices.Contains(e.Evidence.Identities, id) {
			return true
		}
	}
	return false
}

// TestDenyListTPMIdentities: with the tpm variant, a machine is refused
// every credential once the deny list names its attestation key, the EK
// certificate its TPM's manufacturer issued (by issuer digest and serial),
// the Compute Engine instance its AK certificate names (by instance ID),
// or its node name. Before issue 32 an EK or instance entry did not
// parse, and only the AK and the node name were matched.
func TestDenyListTPMIdentities(t *testing.T) {
	testenv.RequireRoot(t) // swtpm_setup manufactures EK certificates as root
	h := newHarness(t, harnessOptions{})

	t.Run("attestation key", func(t *testing.T) {
		h.deniedEverywhere(t, h.node.attester, "deny-ak", net.IPv4(10, 0, 0, 41), identity(t, h.node.attester))
	})
	t.Run("node name", func(t *testing.T) {
		h.deniedEverywhere(t, h.node.attester, "deny-node", net.IPv4(10, 0, 0, 42), "node:deny-node")
	})
	t.Run("EK certificate", func(t *testing.T) {
		ca := swtpmtest.CA(t)
		h.trustManufacturer(t, ca)
		defer func() {
			h.ekRoots, h.ekIntermediates = "", ""
			h.applyJoinConfig(t, h.joinConfigData(t, nil))
		}()
		machine := manufacturedNode(t, ca, policy.RoleWorker)
		cert, err := x509.ParseCertificate(machine.EKCertificate())
		if err != nil {
			t.Fatal(err)
		}
		issuer := sha256.Sum256(cert.RawIssuer)
		h.deniedEverywhere(t, machine, "deny-ek", net.IPv4(10, 0, 0, 43), "tpm-ek:"+hex.EncodeToString(issuer[:])+":"+cert.SerialNumber.Text(16))
	})
	t.Run("Compute Engine instance", func(t *testing.T) {
		google := testkit.NewCA(t, "test vTPM CA standing in for Google's")
		h.applyKeyTrust(t, map[string]any{"gce": map[string]any{"projects": []string{"my-project"}, "roots": string(google.PEM)}})
		defer h.applyJoinConfig(t, h.joinConfigData(t, nil))
		rw := swtpmtest.Boot(t, t.TempDir(), bootArtefacts(policy.RoleWorker))
		swtpmtest.ProvisionGCE(t, rw, google, swtpmtest.GCEInstance{Zone: "europe-west3-a", ProjectID: "my-project", ProjectNumber: 42, ID: 4567890123456789012, Name: "node-7"})
		machine, err := tpmattester.New(rw, tpmattester.Options{PCRs: testPCRs, AttestationKey: tpmattester.AKGCE})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = machine.Close() })
		h.deniedEverywhere(t, machine, "deny-gce", net.IPv4(10, 0, 0, 44), "gce-instance:my-project/europe-west3-a/4567890123456789012")
	})
}

// TestDenyListConfidentialVMHosts: with the sev-snp and tdx variants, a VM
// is refused every credential once the deny list names the SEV-SNP chip or
// the TDX platform it runs on, although its vTPM's key is not denied; a
// host that masks CHIP_ID is still named by the VCEK that signs its
// reports. Before issue 32 these entries parsed but were never matched: a
// VM on a denied chip joined and rejoined.
func TestDenyListConfidentialVMHosts(t *testing.T) {
	testenv.RequireRoot(t)
	launch := bytes.Repeat([]byte{0xaa}, 48)

	t.Run("SEV-SNP chip", func(t *testing.T) {
		tcb := kds.TCBParts{BlSpl: 3, SnpSpl: 8, UcodeSpl: 115}
		amd := snptest.NewAMD(t, snptest.Options{TCB: tcb, ChipID: bytes.Repeat([]byte{0x5a}, 64)})
		h := newHarness(t, harnessOptions{variant: attestation.VariantSNP, hardware: map[string]any{"sevSnp": map[string]any{
			"launchMeasurements": []string{hex.EncodeToString(launch)},
			"minimumTCB":         map[string]any{"bootloader": 3, "snp": 8, "microcode": 115},
			"roots":              []string{amd.CertChainPEM()},
		}}})
		chip := "sev-snp-chip:" + hex.EncodeToString(amd.ChipID)
		for i, tt := range []struct {
			name string
			mask bool
		}{{"CHIP_ID in the report", false}, {"CHIP_ID masked by the host", true}} {
			t.Run(tt.name, func(t *testing.T) {
				hw, err := snpguest.NewWithProvider(amd.Device(t, snptest.Report{Measurement: launch, MaskChipID: tt.mask}))
				if err != nil {
					t.Fatal(err)
				}
				machine, err := cvm.NewCompositeAttester(hw, h.node.attester)
				if err != nil {
					t.Fatal(err)
				}
				h.deniedEverywhere(t, machine, fmt.Sprintf("deny-snp-%d", i), net.IPv4(10, 0, 0, byte(51+i)), chip)
			})
		}
	})
	t.Run("TDX platform", func(t *testing.T) {
		intel := tdxtest.NewIntel(t)
		h := newHarness(t, harnessOptions{variant: attestation.VariantTDX, hardware: map[string]any{"tdx": map[string]any{
			"mrtd": hex.EncodeToString(launch), "roots": intel.RootPEM(),
		}}})
		hw, err := tdxguest.NewWithProvider(intel.Device(t, func(b *pb.TDQuoteBody) { b.MrTd = launch }))
		if err != nil {
			t.Fatal(err)
		}
		machine, err := cvm.NewCompositeAttester(hw, h.node.attester)
		if err != nil {
			t.Fatal(err)
		}
		// The PPID of the PCK certificate the test hierarchy's quotes
		// carry (go-tdx-guest's sample quote's SGX extension).
		chain, err := tdxverify.ExtractChainFromQuote(tdxtest.SampleQuote(t))
		if err != nil {
			t.Fatal(err)
		}
		ext, err := pcs.PckCertificateExtensions(chain.PCKCertificate)
		if err != nil {
			t.Fatal(err)
		}
		h.deniedEverywhere(t, machine, "deny-tdx", net.IPv4(10, 0, 0, 61), "tdx-ppid:"+ext.PPID)
	})
}
