package tpm

// Exported for this package's external tests only.

const MaxEKCertificateSize = maxEKCertificateSize

var NewActivationChallenge = newActivationChallenge
var ParseEKCertificate = parseEKCertificate
var ParseEventLog = parseEventLog
var ReplayEventLog = replayEventLog
var GCERoots = googleRoots
