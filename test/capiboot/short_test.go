//go:build vmnodes && !vmcontrolplane

package capiboot

// longVMTests: see long_test.go.
const longVMTests = false
