//go:build vmnodes && vmcontrolplane

package capiboot

// longVMTests: with the vmcontrolplane tag (`make test-vm-long`) the test
// also boots a second VM, whose data pins another CA. `make test` leaves
// that boot out to stay within CI's hour; the pin's refusal is unit-tested
// in the bootstrapper (TestJoinRefused: a join service of another cluster
// identity is not trusted, the node changes nothing).
const longVMTests = true
