package controller

// Exported for this package's external tests only.

const DefaultMaxUserDataSize = defaultMaxUserDataSize
const Finalizer = finalizer
