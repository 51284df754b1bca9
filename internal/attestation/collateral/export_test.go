package collateral

// Exported for this package's external tests only.

const MaxSize = maxSize
