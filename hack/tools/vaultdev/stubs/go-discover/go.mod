// Stub of github.com/hashicorp/go-discover (cloud auto-join address
// discovery). Vault links it for Raft auto_join, which an in-memory test
// server never uses; replacing it drops the AWS/GCE/Azure/k8s/vSphere/...
// SDKs from the build, roughly halving cold compile time.
module github.com/hashicorp/go-discover

go 1.22
