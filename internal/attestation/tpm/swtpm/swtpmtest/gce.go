package swtpmtest

import (
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"io"
	"math/big"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"

	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

// GCEInstance is the Compute Engine instance a provisioned vTPM's AK
// certificate names.
type GCEInstance struct {
	Zone, ProjectID, Name string
	ProjectNumber, ID     int64
}

// gceInstanceInfo is the instance-identity extension (OID
// 1.3.6.1.4.1.11129.2.1.21) Compute Engine's vTPM CA puts in AK
// certificates, as go-tpm-tools' server package parses it.
type gceInstanceInfo struct {
	Zone               string `asn1:"utf8"`
	ProjectNumber      int64
	ProjectID          string `asn1:"utf8"`
	InstanceID         int64
	InstanceName       string `asn1:"utf8"`
	SecurityProperties struct {
		SecurityVersion int64 `asn1:"explicit,tag:0,optional"`
		IsProduction    bool  `asn1:"explicit,tag:1,optional"`
	} `asn1:"explicit,optional"`
}

// ProvisionGCE provisions the TPM rw as Compute Engine provisions a
// production instance's vTPM: the ECC AK template in NV index 0x01c10003,
// and in 0x01c10002 the AK certificate, issued by ca (standing in for
// Google's vTPM CA) for instance, valid for a day. An attester made with
// tpmattester.AKGCE then sends that certificate.
func ProvisionGCE(t testing.TB, rw io.ReadWriter, ca *testkit.CA, instance GCEInstance) {
	t.Helper()
	template, err := client.AKTemplateECC().Encode()
	if err != nil {
		t.Fatal(err)
	}
	nvWrite(t, rw, client.GceAKTemplateNVIndexECC, template)
	ak, err := client.KeyFromNvIndex(rw, tpm2.HandleEndorsement, client.GceAKTemplateNVIndexECC)
	if err != nil {
		t.Fatal(err)
	}
	akPub := ak.PublicKey()
	ak.Close()
	info := gceInstanceInfo{Zone: instance.Zone, ProjectNumber: instance.ProjectNumber, ProjectID: instance.ProjectID,
		InstanceID: instance.ID, InstanceName: instance.Name}
	info.SecurityProperties.IsProduction = true
	infoDER, err := asn1.Marshal(info)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(instance.ID), Subject: pkix.Name{CommonName: strconv.FormatInt(instance.ID, 10)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtraExtensions: []pkix.Extension{{Id: asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 11129, 2, 1, 21}, Value: infoDER}}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca.Cert, akPub, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	nvWrite(t, rw, client.GceAKCertNVIndexECC, leafDER)
}

// nvWrite defines an owner-readable NV index holding data.
func nvWrite(t testing.TB, rw io.ReadWriter, index uint32, data []byte) {
	t.Helper()
	attrs := tpm2.AttrOwnerWrite | tpm2.AttrOwnerRead | tpm2.AttrAuthRead | tpm2.AttrAuthWrite
	if err := tpm2.NVDefineSpace(rw, tpm2.HandleOwner, tpmutil.Handle(index), "", "", nil, attrs, uint16(len(data))); err != nil {
		t.Fatalf("defining NV index %#x: %v", index, err)
	}
	for off := 0; off < len(data); off += 512 {
		end := min(off+512, len(data))
		if err := tpm2.NVWrite(rw, tpm2.HandleOwner, tpmutil.Handle(index), "", data[off:end], uint16(off)); err != nil {
			t.Fatalf("writing NV index %#x: %v", index, err)
		}
	}
}
