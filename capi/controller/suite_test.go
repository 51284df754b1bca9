package controller_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/gatehouse-dev/gatehouse/capi/controller/controllertest"
)

// testEnv is the one API server of this package's tests (Cluster API's
// suite_test.go pattern); each test works in namespaces of its own.
var testEnv *env

// TestMain starts the API server, runs the tests, stops it, and fails when
// a test left a goroutine running (a manager or client not stopped).
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	e, stop, err := controllertest.Start(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the test API server:", err)
		return 1
	}
	testEnv = &env{e}
	code := m.Run()
	if err := stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the test API server:", err)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(
			// klog's flush daemon runs for the life of the process once
			// anything logs through klog (client-go does).
			goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
		); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

func newEnv(*testing.T) *env { return testEnv }
