package cli

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/gatehouse-dev/gatehouse/internal/kms/kek/kektest"
)

// TestMain fails the package's tests when a test leaves a goroutine running
// (a server not stopped, a connection not closed).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, kektest.IgnoreLocalKMSDrain)
}
