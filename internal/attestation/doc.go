// Package attestation defines the attester and verifier roles of remote
// attestation (IETF RATS, RFC 9334 §3) as Gatehouse uses them: the
// Attester and Verifier interfaces, the Result a verifier returns, the
// variants' names and object identifiers, and the identities a node is
// known by. It is the root of Gatehouse's attestation library, which lives
// under internal/attestation:
//
// An attester produces evidence bound to caller-chosen user data (in attested
// TLS: the hash of a fresh TLS public key) and to the relying party's nonce.
// A verifier checks the evidence against endorsements (which keys may sign it)
// and reference values (which measurements are expected), and returns the
// bound user data only when every check passed.
//
// What a caller imports:
//
//   - to attest (a node): package choose, whose OpenAttester opens the
//     node's (v)TPM and the attester of its variant;
//   - to verify (the join service, the CLI): package policy, which reads an
//     appraisal policy (the join config's attestation.yaml, the cluster
//     configuration's attestation section) and compiles it, through
//     package choose, into the variant's verifier with node roles;
//   - to compare measurements: package measurements.
//
// Each variant has a stable object identifier under Gatehouse's OID arc (see
// OID), which names the X.509 extension carrying its evidence, and one entry
// in package choose's registry: tpm (package tpm and tpm/tpmattester), and
// the confidential VM variants sev-snp and tdx (package cvm, which binds a
// vTPM quote to the hardware report of package snp or tdx and their guest
// attesters snp/snpguest and tdx/tdxguest). Package collateral fetches and
// caches the vendors' collateral; packages tpm/swtpm, snp/snptest and
// tdx/tdxtest are the test devices. docs/attestation.md describes the
// evidence and each check.
package attestation
