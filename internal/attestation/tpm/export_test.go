package tpm

// Exported for this package's external tests only.

const MaxEKCertificateSize = maxEKCertificateSize

var NewActivationChallenge = newActivationChallenge
var ParseEKCertificate = parseEKCertificate
var ParseEventLog = parseEventLog
var ReplayEventLog = replayEventLog
var GCERoots = googleRoots

var ReplayTCGEventLog = replayTCGEventLog

// ForgetReplays empties v's cache of replayed TCG event logs, so the next
// verification parses its log again.
func (v *QuoteVerifier) ForgetReplays() { v.replays = newReplayCache() }
