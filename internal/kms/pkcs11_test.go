package kms_test

import (
	"testing"

	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/kms/kmstest"
)

func TestOpenPKCS11Errors(t *testing.T) {
	uri := kmstest.NewSoftHSM(t)
	wrongLabel := *uri
	wrongLabel.KeyLabel = "missing"
	if _, _, err := kms.OpenPKCS11(&wrongLabel); err == nil {
		t.Fatal("opened a KEK that does not exist")
	}
	noPIN := *uri
	noPIN.PinSource = "file:/nonexistent/pin"
	if _, _, err := kms.OpenPKCS11(&noPIN); err == nil {
		t.Fatal("opened the token without a PIN")
	}
}
