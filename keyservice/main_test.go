package keyservice

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a test leaves a goroutine running
// (a server not stopped, a connection not closed). local-kms's LevelDB
// drains its memory pool for up to a second after it is closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/syndtr/goleveldb/leveldb.(*DB).mpoolDrain"))
}
