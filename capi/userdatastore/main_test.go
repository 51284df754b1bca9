package userdatastore

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a test leaves a goroutine running
// (a server, manager or client not stopped).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
