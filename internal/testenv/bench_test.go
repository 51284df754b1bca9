package testenv

import (
	"testing"
	"time"
)

// BenchmarkStart measures starting and stopping a whole environment (fresh
// PKI, etcd, kube-apiserver until /readyz is ok; with the controller manager
// until its /healthz is ok) and reports the kube-apiserver part separately.
func BenchmarkStart(b *testing.B) {
	for _, tt := range []struct {
		name string
		opts Options
	}{
		{name: "apiserver", opts: Options{}},
		{name: "apiserver+controller-manager", opts: Options{ControllerManager: true}},
	} {
		b.Run(tt.name, func(b *testing.B) {
			var apiserver time.Duration
			for b.Loop() {
				env, err := Start(b.Context(), tt.opts)
				if err != nil {
					b.Fatal(err)
				}
				apiserver += env.APIServerStartup
				b.StopTimer()
				if err := env.Stop(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(apiserver.Milliseconds())/float64(b.N), "apiserver-ready-ms/op")
		})
	}
}
