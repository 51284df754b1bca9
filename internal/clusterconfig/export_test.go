package clusterconfig

// Exported for this package's external tests only.

var Parse = parse
